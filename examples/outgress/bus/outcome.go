package bus

import (
	"time"

	"github.com/admitkit/admit/examples/outgress/internal/label"
)

// A [Handler]'s error tells the bus what to do with the message:
//
//	nil              Ack (confirmed by the server)
//	*ExpectedNack    NakWithDelay(RetryAfter); count by reason; no error
//	                 report, no log (expected backpressure). Term instead,
//	                 counted as NoTimeToRetry(reason), when RetryAfter
//	                 reaches past the message's lifetime
//	*Dropped         Term: never redelivered; count by reason
//	any other error  NakWithDelay(Config.ErrorDelay); report it (Term,
//	                 DropNoTimeError, when the delay reaches past the
//	                 message's lifetime)
//
// Expected nacks and drops are values of a fixed set of reasons, so metrics
// labelled by reason stay bounded.

// NackReason says why work was postponed.
type NackReason uint8

// The nack reasons.
const (
	NackPaused    NackReason = iota // the kill switch is on
	NackLimited                     // a bucket refused; RetryAfter is the limiter's
	NackThrottled                   // Helix answered 429
	NumNackReasons
)

var nackNames = [NumNackReasons]string{"paused", "limited", "throttled"}

// String is the reason's metric label.
func (r NackReason) String() string { return label.Of(nackNames[:], r) }

// ExpectedNack postpones a message: expected backpressure, not a failure.
type ExpectedNack struct {
	Reason     NackReason
	RetryAfter time.Duration // redeliver no sooner than this
	// SameDelayAsError redelivers after the bus's ErrorDelay, as an error
	// would be, whatever RetryAfter says: the expected nack is only not
	// reported, its delivery timing unchanged.
	SameDelayAsError bool
}

// Error describes the postponement.
func (e *ExpectedNack) Error() string {
	if e.SameDelayAsError {
		return "outgress: postponed (" + e.Reason.String() + "), redelivered after the error delay"
	}
	return "outgress: postponed (" + e.Reason.String() + "), retry after " + e.RetryAfter.String()
}

// DropReason says why a message was acknowledged without doing its work.
type DropReason uint8

// The drop reasons.
const (
	DropMalformed      DropReason = iota // the body can never be valid
	DropUnknownChannel                   // Valkey has no such channel
	DropRejected                         // Helix refused it (4xx other than 429)
	// DropNoTimeLimited and the three after it: the retry delay reaches
	// past the message's lifetime, by the cause of the retry: a limiter
	// denial, the pause, a Helix 429, a dependency failure (an error).
	DropNoTimeLimited
	DropNoTimePaused
	DropNoTimeThrottled
	DropNoTimeError
	DropExpired     // the bus found it past its lifetime
	DropMaxAttempts // the bus gave up redelivering it
	NumDropReasons
)

var dropNames = [NumDropReasons]string{"malformed", "unknown_channel", "rejected",
	"no_time_limited", "no_time_paused", "no_time_throttled", "no_time_error", "expired", "max_attempts"}

// NoTimeToRetry is the drop reason of a retry for reason that would come
// past the message's lifetime.
func NoTimeToRetry(reason NackReason) DropReason {
	switch reason {
	case NackPaused:
		return DropNoTimePaused
	case NackThrottled:
		return DropNoTimeThrottled
	}
	return DropNoTimeLimited
}

// String is the reason's metric label.
func (r DropReason) String() string { return label.Of(dropNames[:], r) }

// Dropped acknowledges a message without doing its work.
type Dropped struct {
	Reason DropReason
	Err    error // the detail, if any; not a metric label
}

// Error describes the drop and its detail.
func (d *Dropped) Error() string {
	if d.Err != nil {
		return "outgress: dropped (" + d.Reason.String() + "): " + d.Err.Error()
	}
	return "outgress: dropped (" + d.Reason.String() + ")"
}

// Unwrap returns the detail.
func (d *Dropped) Unwrap() error { return d.Err }

// RetryOrDrop postpones work by retryAfter, or drops it at once when the
// message would reach its deadline (remaining from now) before the retry:
// redelivering it then would only expire it later, at a cost.
func RetryOrDrop(reason NackReason, retryAfter, remaining time.Duration) error {
	if retryAfter >= remaining {
		return &Dropped{Reason: NoTimeToRetry(reason)}
	}
	return &ExpectedNack{Reason: reason, RetryAfter: retryAfter}
}

// Outcome is what became of one delivery.
type Outcome uint8

// The outcomes. Acked and Dropped are final: the stream forgets the
// message. Nacked and Error redeliver it later; Released hands it back at
// once, unhandled, to another replica when this one stops.
const (
	OutcomeAcked    Outcome = iota
	OutcomeNacked           // expected backpressure: NakWithDelay(RetryAfter)
	OutcomeDropped          // Term: acknowledged without doing the work
	OutcomeError            // an unexpected error: reported, NakWithDelay(ErrorDelay)
	OutcomeReleased         // Nak without delay: the replica is stopping
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"acked", "nacked", "dropped", "error", "released"}

// String is the outcome's metric label.
func (o Outcome) String() string { return label.Of(outcomeNames[:], o) }

// Final reports whether the outcome ends the message's life in the stream.
func (o Outcome) Final() bool { return o == OutcomeAcked || o == OutcomeDropped }
