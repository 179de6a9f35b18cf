package server

import (
	"cmp"
	"strings"

	"github.com/postbox-events/postbox/internal/delivery"
	iserver "github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// validate refuses what New cannot serve, naming the field at fault. Zero
// fields are left to their defaults.
func (cfg Config) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBatch", int64(cfg.MaxBatch)},
		{"QueueSize", int64(cfg.QueueSize)},
		{"QueueBytes", int64(cfg.QueueBytes)},
		{"ReadTimeout", int64(cfg.ReadTimeout)},
		{"IdleTimeout", int64(cfg.IdleTimeout)},
		{"MaxHeaderBytes", int64(cfg.MaxHeaderBytes)},
		{"MaxConnections", int64(cfg.MaxConnections)},
		{"StoreProbeInterval", int64(cfg.StoreProbeInterval)},
		{"PingTimeout", int64(cfg.PingTimeout)},
		{"WSBufferBytes", cfg.WSBufferBytes},
		{"WSMaxFrameBytes", cfg.WSMaxFrameBytes},
		{"SourceBufferBytes", cfg.SourceBufferBytes},
		{"WSFrameTimeout", int64(cfg.WSFrameTimeout)},
		{"Limits.MaxEnvelopeBytes", int64(cfg.Limits.MaxEnvelopeBytes)},
		{"Limits.MaxIDBytes", int64(cfg.Limits.MaxIDBytes)},
		{"Limits.MaxTypeBytes", int64(cfg.Limits.MaxTypeBytes)},
		{"Webhooks.MaxBytes", cfg.Webhooks.MaxBytes},
		{"Delivery.Workers", int64(cfg.Delivery.Workers)},
		{"Delivery.MaxAttempts", int64(cfg.Delivery.MaxAttempts)},
		{"Delivery.RetryBaseDelay", int64(cfg.Delivery.RetryBaseDelay)},
		{"Delivery.RetryMaxDelay", int64(cfg.Delivery.RetryMaxDelay)},
		{"Delivery.HandlerTimeout", int64(cfg.Delivery.HandlerTimeout)},
		{"Delivery.CleanupInterval", int64(cfg.Delivery.CleanupInterval)},
		{"Delivery.LeaseTTL", int64(cfg.Delivery.LeaseTTL)},
	} {
		if f.v < 0 {
			return errorf("Config.%s must not be negative (0 takes its default)", f.name)
		}
	}
	switch strings.ToUpper(cfg.Synchronous) {
	case "", "FULL", "NORMAL":
	default:
		return errorf("Config.Synchronous %q: use FULL or NORMAL", cfg.Synchronous)
	}
	switch cfg.WALCheckpoint {
	case "", "auto", "litestream":
	default:
		return errorf("Config.WALCheckpoint %q: use auto or litestream", cfg.WALCheckpoint)
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errorf("Config.TLSCert and Config.TLSKey go together: set both or neither")
	}
	base := cmp.Or(cfg.Delivery.RetryBaseDelay, DefaultRetryBaseDelay)
	most := cmp.Or(cfg.Delivery.RetryMaxDelay, DefaultRetryMaxDelay)
	if base > most {
		return errorf("Config.Delivery.RetryBaseDelay %v is above Config.Delivery.RetryMaxDelay %v", base, most)
	}
	for i, secret := range cfg.Webhooks.Secrets {
		if _, err := stdwebhook.CheckSecret(secret); err != nil {
			return errorf("Config.Webhooks.Secrets[%d]: %v", i, err)
		}
	}
	for inbox, h := range cfg.Handlers {
		if h == nil {
			return errorf("Config.Handlers[%q] is nil", inbox)
		}
	}
	if cfg.Store != nil && cfg.Streams == nil {
		return errorf("Config.Store without Config.Streams: set both, or Streams alone, or neither (SQLite for both); " +
			"servers sharing a PostgreSQL store need streams they share too")
	}
	return nil
}

// internal is cfg as the control plane takes it: the one place the
// public Config is mapped to the internal one.
func (cfg Config) internal() iserver.Config {
	out := iserver.Config{
		Addr:                       cfg.Addr,
		Listener:                   cfg.Listener,
		GRPCAddr:                   cfg.GRPCAddr,
		GRPCListener:               cfg.GRPCListener,
		TLSCert:                    cfg.TLSCert,
		TLSKey:                     cfg.TLSKey,
		Streams:                    cfg.Streams,
		DBPath:                     cfg.DBPath,
		Synchronous:                strings.ToUpper(cfg.Synchronous),
		WALCheckpoint:              cfg.WALCheckpoint,
		MaxBatch:                   cfg.MaxBatch,
		QueueSize:                  cfg.QueueSize,
		QueueBytes:                 cfg.QueueBytes,
		Limits:                     cfg.Limits,
		Tokens:                     cfg.Tokens.internal(),
		APIToken:                   cfg.APIToken,
		InsecureNoAPIToken:         cfg.InsecureNoAPIToken,
		AllowedHosts:               cfg.AllowedHosts,
		AllowedOrigins:             cfg.AllowedOrigins,
		WSMaxConnectionsPerAddress: cfg.WSMaxConnectionsPerAddress,
		ReadTimeout:                cfg.ReadTimeout,
		IdleTimeout:                cfg.IdleTimeout,
		MaxHeaderBytes:             cfg.MaxHeaderBytes,
		MaxConnections:             cfg.MaxConnections,
		StoreProbeInterval:         cfg.StoreProbeInterval,
		PingInterval:               cfg.PingInterval,
		PingTimeout:                cfg.PingTimeout,
		WSMaxConnections:           cfg.WSMaxConnections,
		WSBufferBytes:              cfg.WSBufferBytes,
		WSMaxFrameBytes:            cfg.WSMaxFrameBytes,
		SourceBufferBytes:          cfg.SourceBufferBytes,
		WSFrameTimeout:             cfg.WSFrameTimeout,
		Webhooks: iserver.WebhookConfig{
			MaxBytes:   cfg.Webhooks.MaxBytes,
			KeyHeader:  cfg.Webhooks.KeyHeader,
			KeyField:   cfg.Webhooks.KeyField,
			TypeHeader: cfg.Webhooks.TypeHeader,
			TypeField:  cfg.Webhooks.TypeField,
			Secrets:    cfg.Webhooks.Secrets,
			Target:     cfg.Webhooks.Target,
		},
		Delivery: delivery.Config{
			Workers:               cfg.Delivery.Workers,
			MaxAttempts:           cfg.Delivery.MaxAttempts,
			RetryBaseDelay:        cfg.Delivery.RetryBaseDelay,
			RetryMaxDelay:         cfg.Delivery.RetryMaxDelay,
			Jitter:                cfg.Delivery.Jitter,
			HandlerTimeout:        cfg.Delivery.HandlerTimeout,
			HTTPClient:            cfg.Delivery.HTTPClient,
			AllowLinkLocalTargets: cfg.Delivery.AllowLinkLocalTargets,
			DenyPrivateTargets:    cfg.Delivery.DenyPrivateTargets,
			Retention:             cfg.Delivery.Retention,
			CleanupInterval:       cfg.Delivery.CleanupInterval,
			Node:                  cfg.Delivery.Node,
			LeaseTTL:              cfg.Delivery.LeaseTTL,
		},
		Logger: cfg.Logger,
	}
	switch st := cfg.Store.(type) {
	case nil:
	case *PostgresStore:
		out.Store = st.s // the store the control plane shares work through (delivery.SharedStore)
	default:
		out.Store = st
	}
	if cfg.Handlers != nil {
		out.Handlers = make(map[string]delivery.Handler, len(cfg.Handlers))
		for inbox, h := range cfg.Handlers {
			out.Handlers[inbox] = h.internal()
		}
	}
	return out
}
