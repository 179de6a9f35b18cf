package api

import "net/http"

// Code says what went wrong with a request, for programs to branch on. The
// server answers each code with one HTTP status, its Status; Codes lists
// them all. docs/openapi.json and docs/API.md are checked against Codes.
type Code string

// Error codes of the API.
const (
	// CodeInvalidJSON: the body is not JSON, not the JSON value asked
	// for, or has a field of the wrong type. 400.
	CodeInvalidJSON Code = "invalid_json"
	// CodeUnknownField: the body has a field the endpoint does not take. 400.
	CodeUnknownField Code = "unknown_field"
	// CodeInvalidField: a field's, parameter's or header's value is refused;
	// the message names it. 400.
	CodeInvalidField Code = "invalid_field"
	// CodeMissingField: a required field, parameter or header is absent. 400.
	CodeMissingField Code = "missing_field"
	// CodeInvalidSource: a webhook was sent to a source that is not of
	// kind webhook. 400.
	CodeInvalidSource Code = "invalid_source"
	// CodeUnauthorized: the API token is missing or wrong. 401.
	CodeUnauthorized Code = "unauthorized"
	// CodeInvalidSignature: a webhook's signature is missing or does not
	// verify with the source's secrets. 401.
	CodeInvalidSignature Code = "invalid_signature"
	// CodeCrossOrigin: a browser page of another origin asked the operator
	// API to change something; the message names the origin. 403.
	CodeCrossOrigin Code = "cross_origin"
	// CodeNotFound: no subscription, source, stream, consumer, inbox,
	// item or webhook has that name or id; no route takes the path, or
	// the path is not clean. 404.
	CodeNotFound Code = "not_found"
	// CodeMethodNotAllowed: the path takes other methods (Allow names
	// them). 405.
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeRequestTimeout: the body did not arrive in time. 408.
	CodeRequestTimeout Code = "request_timeout"
	// CodeConflict: it exists already with another definition, or is in
	// use. 409.
	CodeConflict Code = "conflict"
	// CodeLeaseLost: the lease expired or another holds the item. 409,
	// or per item in the results of an ack, nack or extend.
	CodeLeaseLost Code = "lease_lost"
	// CodeInvalidState: the item's state does not allow the request. 409,
	// or per item in the results of an ack, nack or extend.
	CodeInvalidState Code = "invalid_state"
	// CodeUpgradeRequired: a request to the WebSocket ingress that is not
	// a WebSocket upgrade. 426.
	CodeUpgradeRequired Code = "upgrade_required"
	// CodeTooLarge: the body is over the server's limit. 413.
	CodeTooLarge Code = "too_large"
	// CodeUnsupportedMediaType: an operator request whose body is not
	// application/json, or a CloudEvents webhook in a mode or with data
	// postbox does not take. 415.
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodeHostNotAllowed: the Host header names the server under a name
	// it was not told it has (a page rebinding a DNS name to it, or a
	// name missing from --allowed-hosts). 421.
	CodeHostNotAllowed Code = "host_not_allowed"
	// CodeQueueFull: the server's write queue is full; send again after
	// Retry-After. 429.
	CodeQueueFull Code = "queue_full"
	// CodeRateLimited: a webhook is over its source's rate limit
	// (rate_limit); send it again after Retry-After. 429.
	CodeRateLimited Code = "rate_limited"
	// CodeNotKept: the server does not keep what was asked for (the
	// stream backend keeps no history of consumer commits; the store is
	// not a SQLite file GET /v1/backup can copy). 501.
	CodeNotKept Code = "not_kept"
	// CodeUnavailable: the store did not answer, or the server is
	// shutting down; send again later. 503.
	CodeUnavailable Code = "unavailable"
	// CodeTooManyConnections: the WebSocket ingress holds as many
	// connections as it allows; connect again later. 503.
	CodeTooManyConnections Code = "too_many_connections"
)

// CodeInfo is one row of the table of codes: the HTTP status the server
// answers Code with, and when.
type CodeInfo struct {
	Code   Code
	Status int
	When   string
}

// codes is the table: every code, its status and meaning, by status.
var codes = []CodeInfo{
	{CodeInvalidJSON, http.StatusBadRequest, "the body is not JSON, or has a field of the wrong type"},
	{CodeUnknownField, http.StatusBadRequest, "the body has a field this endpoint does not take (the message names it)"},
	{CodeInvalidField, http.StatusBadRequest, "a field's value is wrong (the message names the field and why)"},
	{CodeMissingField, http.StatusBadRequest, "a required field is absent"},
	{CodeInvalidSource, http.StatusBadRequest, "a webhook was sent to a source that is not of kind `webhook`"},
	{CodeUnauthorized, http.StatusUnauthorized, "the server has an API token and the request did not carry it"},
	{CodeInvalidSignature, http.StatusUnauthorized, "a webhook's signature is missing or does not verify with its source's secrets"},
	{CodeCrossOrigin, http.StatusForbidden, "a browser page of another origin than the server's own (Origin, Sec-Fetch-Site) asked to change something (`--allowed-origins` lets it), or a page of another site asked for a backup (`GET /v1/backup`)"},
	{CodeNotFound, http.StatusNotFound, "no subscription, source, stream, consumer, inbox, item or webhook has that name or id; no route takes the path, or the path is not in its clean form (`//`, `/./`, `/../`)"},
	{CodeMethodNotAllowed, http.StatusMethodNotAllowed, "the path takes other methods, which `Allow` names"},
	{CodeRequestTimeout, http.StatusRequestTimeout, "the body did not arrive within `--http-read-timeout` (30s) of the headers"},
	{CodeConflict, http.StatusConflict, "a subscription or source of that name exists with another definition, a subscription's inbox has another target, or subscriptions read a source being deleted"},
	{CodeLeaseLost, http.StatusConflict, "an item no longer holds the lease"},
	{CodeInvalidState, http.StatusConflict, "an item is not in a state the request needs"},
	{CodeTooLarge, http.StatusRequestEntityTooLarge, "the body is over 1 MiB"},
	{CodeUnsupportedMediaType, http.StatusUnsupportedMediaType, "a POST, PATCH or DELETE to the operator API has a body that is not `application/json`; a webhook is a CloudEvent in batched mode, or its data is not JSON"},
	{CodeHostNotAllowed, http.StatusMisdirectedRequest, "the Host header is not an IP address, localhost, the `--addr` host or one of `--allowed-hosts` (operator API, console and /metrics only)"},
	{CodeUpgradeRequired, http.StatusUpgradeRequired, "a request to `GET /v1/ws` is not a WebSocket upgrade"},
	{CodeQueueFull, http.StatusTooManyRequests, "a webhook found the server's write queue full: send it again after `Retry-After`"},
	{CodeRateLimited, http.StatusTooManyRequests, "a webhook is over its source's `rate_limit`, which the message names: send it again after `Retry-After`"},
	{CodeNotKept, http.StatusNotImplemented, "the stream backend keeps no history of consumer commits; the store is not a SQLite file `GET /v1/backup` can copy"},
	{CodeUnavailable, http.StatusServiceUnavailable, "the server is starting or shutting down, or its store failed: send it again"},
	{CodeTooManyConnections, http.StatusServiceUnavailable, "the WebSocket ingress holds as many connections as it allows: connect again after `Retry-After`"},
}

// Codes returns the table of every code of the API, its HTTP status and
// when the server answers it, ordered by status.
func Codes() []CodeInfo {
	return append([]CodeInfo(nil), codes...)
}

// Status is the HTTP status the server answers c with; 500 for a code not
// in the table.
func (c Code) Status() int {
	for _, ci := range codes {
		if ci.Code == c {
			return ci.Status
		}
	}
	return http.StatusInternalServerError
}
