package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"go.opentelemetry.io/otel"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/telemetry"
)

func cmdServe(args, environ []string, stdout, stderr io.Writer) int {
	cf := config.NewFlags("serve", stderr)
	if err := cf.Parse(args, environ); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane serve: %v\n", err)
		return exitUsage
	}
	// Signals first, so that SIGTERM during a slow start is honoured.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	l, problems := loadConfig(cf, environ)
	if len(problems) > 0 {
		config.PrintProblems(stderr, l, problems)
		fmt.Fprintln(stderr, "decodeplane: refusing to start; fix the configuration (check it with 'decodeplane validate').")
		return exitUsage
	}
	cfg := l.Config
	log := telemetry.NewLogger(stderr, cfg.Log)
	for _, w := range l.Warnings() {
		log.Warn("configuration warning", "key", w.Key, "message", w.Message)
	}
	d, err := daemon.Build(ctx, cfg, daemon.Options{Logger: log, Version: version, Entries: daemon.Entries(l), Environ: environ})
	if err != nil {
		var ue *config.UsageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "decodeplane: %v\n", err)
			return exitUsage
		}
		log.Error("startup failed", "err", err)
		return exitFailure
	}
	otel.SetTracerProvider(d.TracerProvider())
	otel.SetTextMapPropagator(d.Propagator())
	// Under systemd (Type=notify): READY=1 once the listeners serve,
	// STOPPING=1 when SIGINT/SIGTERM starts the drain.
	notified := make(chan struct{})
	defer func() { <-notified }()
	runDone := make(chan struct{})
	defer close(runDone)
	go func() {
		defer close(notified)
		notify := func(state string) {
			if err := sdNotify(environ, state); err != nil {
				log.Warn("sd_notify failed", "state", state, "err", err)
			}
		}
		select {
		case <-d.Started():
			notify("READY=1")
		case <-runDone:
			return
		}
		select {
		case <-ctx.Done():
			notify("STOPPING=1")
		case <-runDone:
		}
	}()
	if err := d.Run(ctx); err != nil {
		var cut *daemon.CutShortError
		if errors.As(err, &cut) {
			log.Warn("decodeplane stopped; the graceful stop was cut short", "exit_code", exitCutShort, "reason", cut.Error())
			return exitCutShort
		}
		log.Error("daemon failed", "err", err)
		return exitFailure
	}
	log.Info("decodeplane stopped")
	return exitOK
}
