package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox/api"
)

// API is a client of the HTTP API of postbox serve (docs/API.md): the
// operator's calls (subscriptions, sources, streams, dead letters,
// replays) and the runtime's (lease, ack, nack, extend; Inbox runs a
// handler over them). Its request and response types are package api's,
// the ones the server encodes. An API is safe for concurrent use.
//
// An answer of 400 and above is an *APIError; errors.Is matches it with
// ErrNotFound, ErrConflict, ErrLeaseLost, ErrInvalidState, ErrInvalid and
// ErrUnauthorized.
type API struct {
	base    string
	token   string
	hc      *http.Client
	timeout time.Duration
}

// APIOptions configure an API client.
type APIOptions struct {
	// Token is the server's API token (serve --api-token), sent as
	// Authorization: Bearer TOKEN. "": none.
	Token string
	// HTTPClient sends the requests. Defaults to a client of its own with
	// keep-alive connections to the server (as many idle ones as
	// DefaultMaxIdleConns).
	HTTPClient *http.Client
	// Timeout bounds one call; a lease adds its wait to it. Defaults to
	// DefaultAPITimeout.
	Timeout time.Duration
}

// DefaultAPITimeout bounds one API call when APIOptions.Timeout is zero.
const DefaultAPITimeout = 30 * time.Second

// DefaultMaxIdleConns is how many idle connections to the server the
// default HTTP client keeps, enough for a runner's concurrent acks.
const DefaultMaxIdleConns = 64

// NewAPI returns a client of the server at baseURL (http://HOST:PORT or
// https://HOST:PORT, without a path or with the path the server is
// mounted at).
func NewAPI(baseURL string, opts APIOptions) (*API, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: server URL %q: want http://HOST:PORT or https://HOST:PORT", baseURL)
	}
	switch {
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("client: server URL %q: want no query or fragment, only http(s)://HOST:PORT and a path prefix", baseURL)
	case u.User != nil:
		return nil, fmt.Errorf("client: server URL %s: credentials in the URL are not sent: use the API token instead (APIOptions.Token)", u.Redacted())
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("client: APIOptions.Timeout must not be negative")
	}
	hc := opts.HTTPClient
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = DefaultMaxIdleConns, DefaultMaxIdleConns
		hc = &http.Client{Transport: t}
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultAPITimeout
	}
	return &API{base: strings.TrimRight(baseURL, "/"), token: opts.Token, hc: hc, timeout: timeout}, nil
}

// BaseURL returns the server's URL the client calls.
func (c *API) BaseURL() string { return c.base }

// Errors an *APIError matches with errors.Is.
var (
	// ErrNotFound: 404, no such subscription, source, stream, item, ...
	ErrNotFound = errors.New("not found")
	// ErrConflict: 409, whatever the code (a subscription or source that
	// exists with another definition, a lost lease, an item's state).
	ErrConflict = errors.New("conflict")
	// ErrLeaseLost: the item no longer holds the lease (it expired, was
	// settled, or another lease holds it): stop working on it.
	ErrLeaseLost = errors.New("lease lost")
	// ErrInvalidState: the item's state does not allow the call (acking a
	// dead letter, replaying an item that is not one).
	ErrInvalidState = errors.New("invalid state")
	// ErrInvalid: 400, the request was refused; the message names the
	// field.
	ErrInvalid = errors.New("invalid request")
)

// APIError is an error answer of the server.
type APIError struct {
	Status  int      // the HTTP status
	Code    api.Code // one of api.Codes; "" when the answer was not the API's JSON error
	Message string
	// Method and Path (with its query) are the call the server answered;
	// "" for an error of an item's result (ResultErr) and of the ingress.
	Method, Path string
}

// CallError is a call of the API that got no answer, or none that could
// be read: the connection failed or the call timed out (Err).
type CallError struct {
	Method, Path string // the call, Path with its query
	Err          error
}

func (e *CallError) Error() string { return e.Method + " " + e.Path + ": " + e.Err.Error() }
func (e *CallError) Unwrap() error { return e.Err }

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("server: %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
	}
	return fmt.Sprintf("server: %d %s: %s", e.Status, e.Code, e.Message)
}

// Is matches ErrNotFound, ErrConflict, ErrLeaseLost, ErrInvalidState,
// ErrInvalid and ErrUnauthorized by status and code.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Status == http.StatusNotFound || e.Code == api.CodeNotFound
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrLeaseLost:
		return e.Code == api.CodeLeaseLost
	case ErrInvalidState:
		return e.Code == api.CodeInvalidState
	case ErrInvalid:
		return e.Status == http.StatusBadRequest
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	}
	return false
}

// IsNotFound reports whether err is the server's 404.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is the server's 409.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// ResultErr returns the error of one item's result of an ack, nack or
// extend as an *APIError (nil when the item was settled): errors.Is
// matches ErrLeaseLost, ErrNotFound or ErrInvalidState.
func ResultErr(r api.ItemResult) error {
	if r.Error == nil {
		return nil
	}
	status := http.StatusConflict
	if r.Error.Code == api.CodeNotFound {
		status = http.StatusNotFound
	}
	return &APIError{Status: status, Code: r.Error.Code, Message: r.Error.Message}
}

// Do sends method path (with its query) to the server with in (nil: no
// body) as JSON, decodes the answer into out (nil: drop it;
// *json.RawMessage: keep it as sent) and returns its status. The typed
// methods are built on it; it serves calls they do not cover. An error
// answer is an *APIError.
func (c *API) Do(ctx context.Context, method, path string, in, out any) (int, error) {
	return c.do(ctx, method, path, in, out, 0)
}

// send is Do without the status.
func (c *API) send(ctx context.Context, method, path string, in, out any) error {
	_, err := c.do(ctx, method, path, in, out, 0)
	return err
}

// do is Do for a call that may wait extra beyond the timeout; it returns
// the answer's status.
func (c *API) do(ctx context.Context, method, path string, in, out any, extra time.Duration) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode the request to %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout+extra)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, fmt.Errorf("server %s: %w", c.base, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, &CallError{Method: method, Path: path, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, &CallError{Method: method, Path: path, Err: fmt.Errorf("read the answer: %w", err)}
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, answerError(resp.StatusCode, data, method, path)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return resp.StatusCode, fmt.Errorf("the answer to %s %s is not what docs/API.md says (%v): %.200s", method, path, err, data)
	}
	return resp.StatusCode, nil
}

// answerError is the *APIError of an error answer: the API's JSON
// error, or the start of whatever else the body holds.
func answerError(status int, data []byte, method, path string) *APIError {
	var e api.ErrorResponse
	if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
		return &APIError{Status: status, Code: e.Error.Code, Message: e.Error.Message, Method: method, Path: path}
	}
	msg := string(bytes.TrimSpace(data))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return &APIError{Status: status, Message: fmt.Sprintf("%s %s: %s", method, path, msg), Method: method, Path: path}
}

// get is Do for a GET.
func (c *API) get(ctx context.Context, path string, out any) error {
	_, err := c.do(ctx, http.MethodGet, path, nil, out, 0)
	return err
}

// name escapes one path segment.
func name(s string) string { return url.PathEscape(s) }

// Streams lists the streams.
func (c *API) Streams(ctx context.Context) ([]api.Stream, error) {
	var out api.StreamList
	return out.Streams, c.get(ctx, "/v1/streams", &out)
}

// Stream returns one stream.
func (c *API) Stream(ctx context.Context, stream string) (api.Stream, error) {
	var out api.Stream
	return out, c.get(ctx, "/v1/streams/"+name(stream), &out)
}

// Consumers lists the consumers: each subscription's position in its
// stream.
func (c *API) Consumers(ctx context.Context) ([]api.Consumer, error) {
	var out api.ConsumerList
	return out.Consumers, c.get(ctx, "/v1/consumers", &out)
}

// Consumer returns one consumer (a subscription's position).
func (c *API) Consumer(ctx context.Context, consumer string) (api.Consumer, error) {
	var out api.Consumer
	return out, c.get(ctx, "/v1/consumers/"+name(consumer), &out)
}

// ResetConsumer moves a consumer to the position req names (exactly one
// of its fields): its subscription reads the stream again from there.
func (c *API) ResetConsumer(ctx context.Context, consumer string, req api.ResetRequest) (api.ConsumerReset, error) {
	var out api.ConsumerReset
	return out, c.send(ctx, http.MethodPost, "/v1/consumers/"+name(consumer)+"/reset", req, &out)
}

// ConsumerCommits returns a consumer's newest commits and resets, at most
// limit (0: the server's default), where the stream backend keeps them.
func (c *API) ConsumerCommits(ctx context.Context, consumer string, limit int) (api.ConsumerHistory, error) {
	path := "/v1/consumers/" + name(consumer) + "/commits"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	var out api.ConsumerHistory
	return out, c.get(ctx, path, &out)
}

// Sources lists the sources.
func (c *API) Sources(ctx context.Context) ([]api.Source, error) {
	var out api.SourceList
	return out.Sources, c.get(ctx, "/v1/sources", &out)
}

// Source returns one source.
func (c *API) Source(ctx context.Context, source string) (api.Source, error) {
	var out api.Source
	return out, c.get(ctx, "/v1/sources/"+name(source), &out)
}

// CreateSource creates a source; created is false when it existed with
// this definition already (another definition is ErrConflict).
func (c *API) CreateSource(ctx context.Context, req api.CreateSource) (src api.Source, created bool, err error) {
	status, err := c.do(ctx, http.MethodPost, "/v1/sources", req, &src, 0)
	return src, status == http.StatusCreated, err
}

// DeleteSource deletes a source.
func (c *API) DeleteSource(ctx context.Context, source string) error {
	return c.send(ctx, http.MethodDelete, "/v1/sources/"+name(source), nil, nil)
}

// Subscriptions lists the subscriptions.
func (c *API) Subscriptions(ctx context.Context) ([]api.Subscription, error) {
	var out api.SubscriptionList
	return out.Subscriptions, c.get(ctx, "/v1/subscriptions", &out)
}

// Subscription returns one subscription.
func (c *API) Subscription(ctx context.Context, subscription string) (api.Subscription, error) {
	var out api.Subscription
	return out, c.get(ctx, "/v1/subscriptions/"+name(subscription), &out)
}

// CreateSubscription creates a subscription; created is false when it
// existed with this definition already (another definition is
// ErrConflict).
func (c *API) CreateSubscription(ctx context.Context, req api.CreateSubscription) (sub api.Subscription, created bool, err error) {
	status, err := c.do(ctx, http.MethodPost, "/v1/subscriptions", req, &sub, 0)
	return sub, status == http.StatusCreated, err
}

// UpdateSubscription changes a subscription's target or endpoint
// settings (set-target) and returns it.
func (c *API) UpdateSubscription(ctx context.Context, subscription string, req api.UpdateSubscription) (api.Subscription, error) {
	var out api.Subscription
	return out, c.send(ctx, http.MethodPatch, "/v1/subscriptions/"+name(subscription), req, &out)
}

// DeleteSubscription deletes a subscription and its consumer.
func (c *API) DeleteSubscription(ctx context.Context, subscription string) error {
	return c.send(ctx, http.MethodDelete, "/v1/subscriptions/"+name(subscription), nil, nil)
}

// EnableSubscription closes the breaker of a subscription's endpoint
// (open or disabled) and returns the subscription.
func (c *API) EnableSubscription(ctx context.Context, subscription string) (api.Subscription, error) {
	var out api.Subscription
	return out, c.send(ctx, http.MethodPost, "/v1/subscriptions/"+name(subscription)+"/enable", nil, &out)
}

// ReplaySubscription starts a replay of every item of a subscription in
// a time range, completed ones included; Replay follows its progress.
func (c *API) ReplaySubscription(ctx context.Context, subscription string, req api.ReplayRange) (api.Replay, error) {
	var out api.Replay
	return out, c.send(ctx, http.MethodPost, "/v1/subscriptions/"+name(subscription)+"/replay", req, &out)
}

// Replays lists the replay jobs, of one subscription unless it is "".
func (c *API) Replays(ctx context.Context, subscription string) ([]api.Replay, error) {
	path := "/v1/replays"
	if subscription != "" {
		path += "?subscription=" + url.QueryEscape(subscription)
	}
	var out api.ReplayList
	return out.Replays, c.get(ctx, path, &out)
}

// Replay returns a replay job and its progress.
func (c *API) Replay(ctx context.Context, id string) (api.Replay, error) {
	var out api.Replay
	return out, c.get(ctx, "/v1/replays/"+name(id), &out)
}

// Inboxes lists the inboxes with their items by state.
func (c *API) Inboxes(ctx context.Context) ([]api.InboxCounts, error) {
	var out api.InboxList
	return out.Inboxes, c.get(ctx, "/v1/inboxes", &out)
}

// ItemsQuery selects a page of items. Zero fields are the server's
// defaults: every state, from the first item, 100 items.
type ItemsQuery struct {
	State string // api.StatePending, ...
	After int64  // the NextAfter of the previous page
	Limit int    // 1 to 1000
}

func (q ItemsQuery) values() url.Values {
	v := url.Values{}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.After != 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// withQuery appends v to path, if any.
func withQuery(path string, v url.Values) string {
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

// Items returns a page of an inbox's items, oldest first.
func (c *API) Items(ctx context.Context, inbox string, q ItemsQuery) (api.ItemPage, error) {
	var out api.ItemPage
	return out, c.get(ctx, withQuery("/v1/inboxes/"+name(inbox)+"/items", q.values()), &out)
}

// Item returns one item of an inbox.
func (c *API) Item(ctx context.Context, inbox string, id int64) (api.Item, error) {
	var out api.Item
	return out, c.get(ctx, itemPath(inbox, id), &out)
}

// Attempts returns the attempt log of an item pushed to an endpoint.
func (c *API) Attempts(ctx context.Context, inbox string, id int64) ([]api.Attempt, error) {
	var out api.AttemptList
	return out.Attempts, c.get(ctx, itemPath(inbox, id)+"/attempts", &out)
}

// LeaseOptions shape a lease. Zero fields are the server's defaults: 10
// items, a visibility timeout of 30s, no wait.
type LeaseOptions struct {
	Max               int           // 1 to 1000 items
	VisibilityTimeout time.Duration // how long the lease holds the items unless extended
	Wait              time.Duration // up to 1m: how long to wait for an item when none is ready
}

// Lease leases up to Max ready items of inbox, each now processing with
// an attempt counted. With Wait, it waits for one when none is ready; an
// answer with no items is no error.
func (c *API) Lease(ctx context.Context, inbox string, o LeaseOptions) (api.Lease, error) {
	var req api.LeaseRequest
	if o.Max != 0 {
		req.Max = &o.Max
	}
	req.VisibilityTimeout, req.Wait = duration(o.VisibilityTimeout), duration(o.Wait)
	var out api.Lease
	_, err := c.do(ctx, http.MethodPost, "/v1/inboxes/"+name(inbox)+"/lease", req, &out, o.Wait)
	return out, err
}

// duration is d as the API reads it, nil for 0.
func duration(d time.Duration) *string {
	if d == 0 {
		return nil
	}
	s := d.String()
	return &s
}

// Ack completes items that lease holds ("" for an operator: any pending
// or processing item). It returns one result per id; ResultErr says why
// one was not acked.
func (c *API) Ack(ctx context.Context, inbox, lease string, ids ...int64) ([]api.ItemResult, error) {
	var out api.Results
	return out.Items, c.send(ctx, http.MethodPost, "/v1/inboxes/"+name(inbox)+"/ack", api.SettleRequest{IDs: ids, Lease: lease}, &out)
}

// NackOptions say what a nack records.
type NackOptions struct {
	Delay  time.Duration // the wait before the next attempt (up to 24h)
	Reason string        // kept as the items' last error
	Dead   bool          // no further attempt can help: dead letters at once (no Delay)
}

// Nack records a failed attempt of items that lease holds: each is
// pending again after Delay, or a dead letter after its last attempt.
func (c *API) Nack(ctx context.Context, inbox, lease string, o NackOptions, ids ...int64) ([]api.ItemResult, error) {
	req := api.SettleRequest{IDs: ids, Lease: lease, Reason: o.Reason, Dead: o.Dead}
	if o.Delay > 0 {
		req.Delay = duration(o.Delay)
	}
	var out api.Results
	return out.Items, c.send(ctx, http.MethodPost, "/v1/inboxes/"+name(inbox)+"/nack", req, &out)
}

// Extend moves the end of lease, for the items ids it still holds, to
// visibility from now (0: the server's 30s): the heartbeat of a job
// that runs long. An item whose result has ErrLeaseLost (ResultErr) is
// no longer the caller's.
func (c *API) Extend(ctx context.Context, inbox, lease string, visibility time.Duration, ids ...int64) (api.Extension, error) {
	var out api.Extension
	req := api.ExtendRequest{IDs: ids, Lease: lease, VisibilityTimeout: duration(visibility)}
	return out, c.send(ctx, http.MethodPost, "/v1/inboxes/"+name(inbox)+"/extend", req, &out)
}

// DeadLetterQuery selects dead letters; zero fields select all, from the
// first, 100 per page.
type DeadLetterQuery struct {
	Inbox, Subscription string
	From, To            time.Time // failed in [From, To)
	After               int64
	Limit               int
}

func (q DeadLetterQuery) values() url.Values {
	v := ItemsQuery{After: q.After, Limit: q.Limit}.values()
	for k, s := range map[string]string{"inbox": q.Inbox, "subscription": q.Subscription} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for k, t := range map[string]time.Time{"from": q.From, "to": q.To} {
		if !t.IsZero() {
			v.Set(k, t.UTC().Format(time.RFC3339Nano))
		}
	}
	return v
}

// DeadLetters returns a page of dead letters (failed items), oldest
// first.
func (c *API) DeadLetters(ctx context.Context, q DeadLetterQuery) (api.ItemPage, error) {
	var out api.ItemPage
	return out, c.get(ctx, withQuery("/v1/dead-letters", q.values()), &out)
}

// DeadLetter returns one dead letter (ErrNotFound when the item is not
// failed).
func (c *API) DeadLetter(ctx context.Context, id int64) (api.Item, error) {
	var out api.Item
	return out, c.get(ctx, fmt.Sprintf("/v1/dead-letters/%d", id), &out)
}

// ReplayDeadLetter makes a dead letter pending again and returns it
// (ErrInvalidState when it is not failed).
func (c *API) ReplayDeadLetter(ctx context.Context, id int64) (api.Item, error) {
	var out api.Item
	return out, c.send(ctx, http.MethodPost, fmt.Sprintf("/v1/dead-letters/%d/replay", id), nil, &out)
}

// ReplayDeadLetters makes every dead letter a selection names pending
// again.
func (c *API) ReplayDeadLetters(ctx context.Context, sel api.ReplayDeadLetters) (api.Replayed, error) {
	var out api.Replayed
	return out, c.send(ctx, http.MethodPost, "/v1/dead-letters/replay", sel, &out)
}

// Webhook returns a webhook taken by POST /webhooks or POST
// /webhooks/{source} and where its delivery stands, by its id ("wh_42",
// or "wh_gh_42" for the source gh).
func (c *API) Webhook(ctx context.Context, id string) (api.Webhook, error) {
	var out api.Webhook
	return out, c.get(ctx, "/webhooks/"+name(id), &out)
}

// WebhookByKey is Webhook by the idempotency key it was sent to POST
// /webhooks with.
func (c *API) WebhookByKey(ctx context.Context, key string) (api.Webhook, error) {
	var out api.Webhook
	return out, c.get(ctx, "/webhooks?idempotency_key="+url.QueryEscape(key), &out)
}

// SourceWebhookByKey is Webhook by the idempotency key it was sent to
// POST /webhooks/{source} with.
func (c *API) SourceWebhookByKey(ctx context.Context, source, key string) (api.Webhook, error) {
	var out api.Webhook
	return out, c.get(ctx, "/webhooks?idempotency_key="+url.QueryEscape(key)+"&source="+url.QueryEscape(source), &out)
}

// Backup fetches a consistent snapshot of the server's SQLite database
// (GET /v1/backup) and writes it to w; it returns the bytes written. The
// call is bounded by ctx alone, not by APIOptions.Timeout: a large
// store takes long to copy. An answer cut short (fewer bytes than its
// Content-Length) is an error. A server whose store is not SQLite
// answers an *APIError of status 501.
func (c *API) Backup(ctx context.Context, w io.Writer) (int64, error) {
	const method, path = http.MethodGet, "/v1/backup"
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return 0, fmt.Errorf("server %s: %w", c.base, err)
	}
	req.Header.Set("Accept", "application/vnd.sqlite3, application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, &CallError{Method: method, Path: path, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return 0, answerError(resp.StatusCode, data, method, path)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, &CallError{Method: method, Path: path, Err: fmt.Errorf("read the snapshot: %w", err)}
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, &CallError{Method: method, Path: path, Err: fmt.Errorf("the snapshot was cut short: %d of %d bytes", n, resp.ContentLength)}
	}
	return n, nil
}
