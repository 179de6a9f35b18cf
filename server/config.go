package server

import (
	"context"
	"database/sql"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/sealed"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// Defaults of Config: a zero field takes them (the flags of postbox serve
// have the same defaults, but for Addr).
const (
	DefaultAddr               = ":8000"
	DefaultDBPath             = "data/postbox.db"
	DefaultSynchronous        = "FULL"
	DefaultMaxBatch           = 2048
	DefaultQueueSize          = 10000
	DefaultQueueBytes         = 64 << 20
	DefaultReadTimeout        = 30 * time.Second
	DefaultIdleTimeout        = 60 * time.Second
	DefaultMaxHeaderBytes     = 64 << 10
	DefaultMaxConnections     = 10000
	DefaultStoreProbeInterval = time.Second
	DefaultPingInterval       = 20 * time.Second
	DefaultPingTimeout        = 10 * time.Second
	DefaultWSMaxConnections   = 5000
	// DefaultWSMaxConnectionsPerAddress: see Config.WSMaxConnectionsPerAddress.
	DefaultWSMaxConnectionsPerAddress = 64
	DefaultWSBufferBytes              = 8 * DefaultWSMaxFrameBytes
	DefaultWSMaxFrameBytes            = 16 << 20
	DefaultWSFrameTimeout             = time.Minute
	DefaultWebhookMaxBytes            = 1 << 20
	DefaultSourceBufferBytes          = 64 << 20
)

// Config configures a Server. Every field may be left zero: the zero
// Config serves on DefaultAddr with its events and delivery state in the
// SQLite file DefaultDBPath. New refuses a negative number or duration
// (except where a field says what one means), naming the field.
type Config struct {
	// Addr is the listen address (host:port) of HTTP: the ingress
	// WebSocket, POST /webhooks, the operator API, /health, /ready and
	// /metrics. Defaults to DefaultAddr, every interface; beyond loopback
	// the server needs APIToken or InsecureNoAPIToken to start.
	Addr string
	// Listener, when set, is served instead of listening on Addr.
	Listener net.Listener
	// GRPCAddr, when set, is the listen address of the gRPC ingress (over
	// TLS with TLSCert and TLSKey). GRPCListener, when set, is served
	// instead. Without either there is no gRPC ingress.
	GRPCAddr     string
	GRPCListener net.Listener
	// TLSCert and TLSKey are the files (PEM) of the certificate and
	// private key HTTPS, WSS and gRPC are served with. Set both or
	// neither; without them the server speaks plain HTTP and gRPC.
	TLSCert string
	TLSKey  string

	// Streams is the stream backend events are appended to and read from
	// (streamnats, streamkafka, streampg, or a streamsqlite.Backend).
	// Defaults to the SQLite file at DBPath. The server closes it.
	Streams stream.Backend
	// Store holds the delivery state: subscriptions, inbox items and read
	// positions. It is a *PostgresStore (OpenPostgresStore), which several
	// servers share, or the *streamsqlite.Backend of OpenSQLite. Defaults
	// to the SQLite file at DBPath, which is then Streams too when Streams
	// is nil. Set Streams with it. The server closes it.
	Store Store
	// DBPath is the SQLite file of whatever of Streams and Store is left
	// nil, created if missing. Defaults to DefaultDBPath.
	DBPath string
	// Synchronous is the SQLite file's synchronous mode: "FULL" (an ACK
	// survives a power loss) or "NORMAL" (an ACK survives a crash of the
	// process). Defaults to DefaultSynchronous.
	Synchronous string
	// WALCheckpoint says who checkpoints the SQLite file's write-ahead
	// log: "auto" (the store itself, as without replication) or
	// "litestream" (never the store: Litestream, which replicates the
	// file, checkpoints the log once it has shipped it; without it
	// running the log grows without bound). Defaults to "auto".
	WALCheckpoint string
	// MaxBatch is the most events written per group commit; 1 commits
	// each event alone. Defaults to DefaultMaxBatch.
	MaxBatch int
	// QueueSize and QueueBytes bound the events, and their payload and
	// metadata bytes, waiting for the writer; when it is full the ingress
	// stops reading and POST /webhooks answers 503. Default to
	// DefaultQueueSize and DefaultQueueBytes.
	QueueSize  int
	QueueBytes int

	// Limits bound each envelope of the ingress (its size, id and type).
	// Zero fields take postbox's defaults (postbox.DefaultMaxEnvelopeBytes…).
	Limits postbox.Limits
	// Tokens, when not nil, makes the ingress (WebSocket and gRPC)
	// require a bearer token, and lets each token send only for its
	// device. Nil: no authentication.
	Tokens Tokens
	// APIToken, when set, is the bearer token the operator API (/v1/...)
	// and /metrics require.
	APIToken string
	// InsecureNoAPIToken lets the server serve the operator API without
	// APIToken on an address beyond loopback. Without it Run refuses to
	// start there: whoever reaches the address could point subscriptions
	// at any target and read every inbox.
	InsecureNoAPIToken bool
	// AllowedHosts are the names, besides IP addresses, localhost and
	// the host of Addr, the operator API, the console and /metrics answer
	// under ("postbox.example.com"; ".example.com" takes its subdomains;
	// "*" any name). Others get 421 host_not_allowed: a page that rebinds
	// its DNS name to the server could otherwise read the API. A server
	// reached under a DNS name (through a load balancer that keeps Host)
	// must list it.
	AllowedHosts []string
	// AllowedOrigins are the origins besides the server's own
	// ("https://ops.example.com") whose browser pages may change state
	// through the operator API; others get 403 cross_origin.
	AllowedOrigins []string

	// ReadTimeout bounds how long a request's body may take to arrive
	// after its headers. Defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no request for
	// this long. Defaults to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; larger ones get 431.
	// Defaults to DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxConnections bounds the open TCP connections, HTTP, WebSocket and
	// TLS alike; more are closed as soon as they are accepted. Defaults to
	// DefaultMaxConnections.
	MaxConnections int
	// StoreProbeInterval is how often, while the store cannot commit, a
	// probe write checks whether it can again. Defaults to
	// DefaultStoreProbeInterval.
	StoreProbeInterval time.Duration

	// PingInterval is how often the peer of an ingress connection is
	// pinged; one that does not answer within PingTimeout is dropped.
	// Default to DefaultPingInterval and DefaultPingTimeout; a negative
	// PingInterval turns pings off.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// WSMaxConnections bounds the open ingress connections (WebSockets and
	// gRPC streams); more are refused (503 with Retry-After, gRPC
	// ResourceExhausted). Defaults to DefaultWSMaxConnections; negative
	// means no bound.
	WSMaxConnections int
	// WSMaxConnectionsPerAddress bounds the open ingress connections
	// without a device token (without Tokens, every connection) from one
	// client address (an IPv4 address, or an IPv6 /64); more are refused
	// as those over WSMaxConnections are. Behind a proxy every connection
	// comes from its address: raise it or turn it off. Defaults to
	// DefaultWSMaxConnectionsPerAddress; negative means no bound.
	WSMaxConnectionsPerAddress int
	// WSBufferBytes bounds the memory of ingress frames being read and of
	// envelopes waiting for the writer's queue, over all connections; a
	// connection that finds no room is not read until there is. Defaults
	// to DefaultWSBufferBytes, and is at least WSMaxFrameBytes.
	WSBufferBytes int64
	// SourceBufferBytes bounds the memory of poll answers and feed lines
	// being read and of their events waiting to be stored, over every
	// poll and feed source; one answer or line is at most half of it.
	// Defaults to DefaultSourceBufferBytes.
	SourceBufferBytes int64
	// WSMaxFrameBytes bounds one ingress frame. Defaults to
	// DefaultWSMaxFrameBytes, and is at least twice
	// Limits.MaxEnvelopeBytes.
	WSMaxFrameBytes int64
	// WSFrameTimeout bounds how long a frame's body may take to arrive
	// after its header; the connection is then closed. Defaults to
	// DefaultWSFrameTimeout.
	WSFrameTimeout time.Duration

	// Webhooks configures POST /webhooks.
	Webhooks WebhookConfig
	// Delivery configures the workers, retries, dead letters and
	// retention.
	Delivery DeliveryConfig
	// Handlers complete the items of inboxes, by inbox name, with Go
	// functions instead of HTTP targets (WebhookSource is the inbox of
	// POST /webhooks).
	Handlers map[string]Handler

	// Logger receives the server's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// WebhookConfig configures POST /webhooks (Config.Webhooks): its size
// bound, where else a webhook's idempotency key and type may be found
// (besides the Idempotency-Key and X-Event-Type headers), the signatures
// it must carry and where it is delivered.
type WebhookConfig struct {
	// MaxBytes bounds a webhook's body; larger ones get 413. Defaults to
	// DefaultWebhookMaxBytes.
	MaxBytes int64
	// KeyHeader is another header holding the idempotency key, such as
	// X-GitHub-Delivery.
	KeyHeader string
	// KeyField is a top-level field of the JSON body holding it, such as
	// Stripe's "id".
	KeyField string
	// TypeHeader is another header holding the type, such as
	// X-GitHub-Event.
	TypeHeader string
	// TypeField is a top-level field of the JSON body holding it, such as
	// Stripe's "type".
	TypeField string
	// Secrets, when set, make every webhook carry a Standard Webhooks
	// signature by one of them ("whsec_…"; several while rotating):
	// webhook-id, webhook-timestamp (within 5 minutes) and
	// webhook-signature. Others are refused with 401.
	Secrets []string
	// Target, when set, is the URL the workers POST each webhook to (the
	// target of the default subscription, WebhookSource). Empty leaves the
	// inbox to a Handler or to runtimes that lease it.
	Target string
}

// Defaults of DeliveryConfig: a zero field takes them.
const (
	DefaultWorkers         = 16
	DefaultMaxAttempts     = 5
	DefaultRetryBaseDelay  = 5 * time.Second
	DefaultRetryMaxDelay   = 5 * time.Minute
	DefaultHandlerTimeout  = 30 * time.Second
	DefaultRetention       = 30 * 24 * time.Hour
	DefaultCleanupInterval = time.Hour
	DefaultLeaseTTL        = 5 * time.Second
)

// DeliveryConfig configures how inbox items are worked (Config.Delivery).
type DeliveryConfig struct {
	// Workers is how many items are handled at once, over every inbox with
	// a Handler or a target. Defaults to DefaultWorkers.
	Workers int
	// MaxAttempts is how many attempts an item gets; after the last one
	// fails it is a dead letter (StateFailed). Defaults to
	// DefaultMaxAttempts.
	MaxAttempts int
	// RetryBaseDelay and RetryMaxDelay shape the backoff between attempts:
	// the n-th retry waits up to RetryBaseDelay·2^(n-1), at most
	// RetryMaxDelay, the part Jitter draws. RetryMaxDelay also bounds what
	// a target's Retry-After or a Handler's retry.RetryAfter asks for.
	// Default to DefaultRetryBaseDelay and DefaultRetryMaxDelay;
	// RetryBaseDelay may not exceed RetryMaxDelay.
	RetryBaseDelay time.Duration
	RetryMaxDelay  time.Duration
	// Jitter is the random part of each retry wait: the zero value,
	// retry.FullJitter, waits anywhere up to it; retry.EqualJitter at
	// least half of it; retry.NoJitter exactly it.
	Jitter retry.Jitter
	// HandlerTimeout bounds one attempt: a Handler's context ends after
	// it, and a POST to a target is abandoned. Defaults to
	// DefaultHandlerTimeout.
	HandlerTimeout time.Duration
	// HTTPClient sends the items of subscriptions with a target URL.
	// Defaults to a client whose dialer applies AllowLinkLocalTargets and
	// DenyPrivateTargets; a client given here is used as it is.
	HTTPClient *http.Client
	// AllowLinkLocalTargets lets targets be link-local addresses
	// (169.254.0.0/16, among them the cloud metadata address, and
	// fe80::/10), refused by default. DenyPrivateTargets refuses loopback,
	// private, carrier-grade NAT and reserved addresses too, for
	// deployments where whoever sets a target is not trusted. The address
	// is checked when a worker connects, after DNS.
	AllowLinkLocalTargets bool
	DenyPrivateTargets    bool
	// Retention is how long completed and failed items, and stream events
	// every consumer has read, are kept; a negative Retention keeps them.
	// Defaults to DefaultRetention.
	Retention time.Duration
	// CleanupInterval is how often retention runs. Defaults to
	// DefaultCleanupInterval.
	CleanupInterval time.Duration
	// Node names this server in logs and in the leases of a shared store
	// (a PostgresStore). Defaults to the host name.
	Node string
	// LeaseTTL is how long the leases of a shared store last unless
	// renewed; they are renewed every LeaseTTL/5. Defaults to
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
}

// Tokens maps each bearer token the ingress accepts to the id of the
// device it may send for (Config.Tokens).
type Tokens map[string]string

// Store is the SQL database that keeps delivery state (Config.Store): a
// *PostgresStore or the *streamsqlite.Backend of OpenSQLite. Its methods
// are for the server; a program passes a Store, it does not call it.
//
// Store is sealed: only postbox's own stores implement it (a type outside
// postbox may embed one of them), since the server runs its own SQL on
// the database and relies on the dialect and the transactions of those.
type Store interface {
	// Update runs fn in a write transaction; fn's error undoes its writes.
	// It may run fn again when its transaction must be retried.
	Update(ctx context.Context, fn func(tx *sql.Tx) error) error
	// Migrate applies a component's migrations (fsys) to the database.
	Migrate(ctx context.Context, component string, fsys fs.FS) error
	// ReadDB returns read-only connections to the database.
	ReadDB() *sql.DB
	// DeliveryStore marks postbox's own stores; a type outside postbox
	// cannot declare it.
	DeliveryStore(sealed.Token)
}
