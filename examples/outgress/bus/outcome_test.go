package bus

import "testing"

// TestLabels checks every reason's and outcome's metric label, and that a
// value past each list is "invalid", not a panic or another's label.
func TestLabels(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{NackPaused.String(), "paused"},
		{NackThrottled.String(), "throttled"},
		{NumNackReasons.String(), "invalid"},
		{NackReason(255).String(), "invalid"},
		{DropMalformed.String(), "malformed"},
		{DropMaxAttempts.String(), "max_attempts"},
		{NumDropReasons.String(), "invalid"},
		{OutcomeAcked.String(), "acked"},
		{OutcomeReleased.String(), "released"},
		{NumOutcomes.String(), "invalid"},
	} {
		if c.got != c.want {
			t.Errorf("label %q, want %q", c.got, c.want)
		}
	}
}
