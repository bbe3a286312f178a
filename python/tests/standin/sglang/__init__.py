"""A stand-in of SGLang's package (see tests/standin/README.md)."""
