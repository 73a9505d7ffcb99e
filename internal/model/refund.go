package model

import "github.com/admitkit/admit"

// Refund gives each request's Cost (0 meaning 1) back to its bucket at
// server time now, as admit's Limiter.Refund documents: the bucket is
// refilled up to now, gains the Cost, and is capped at its burst. A bucket
// absent from states is a full bucket already and is not written. It
// returns the buckets it writes; a key it does not write must be left byte
// for byte as it was.
func Refund(now int64, states map[string]State, reqs ...admit.Request) map[string]Write {
	writes := map[string]Write{}
	for _, r := range reqs {
		st, ok := states[r.Key]
		if !ok {
			continue
		}
		tk, ts := Refill(now, r.Spec, st, true)
		cost := int64(r.Cost)
		if cost == 0 {
			cost = 1
		}
		tk = min(tk+cost, int64(r.Spec.Burst()))
		writes[r.Key] = Write{Tokens: tk, TS: ts, ExpireAtMs: (max(ts, now)+999)/1000 + r.Spec.TTL().Milliseconds()}
	}
	return writes
}
