package outbox

import "github.com/postbox-events/postbox/retry"

// Backoff computes exponential delays: attempt n waits a part, set by its
// Jitter mode (full jitter by default), of min(Max, Base·2^n).
//
// Deprecated: use retry.Backoff, which this is.
type Backoff = retry.Backoff
