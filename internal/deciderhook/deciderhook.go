// Package deciderhook lets package admit tell package edge, which imports
// it, whether a Decider can decide at all, without a call to the store.
package deciderhook

// Check returns an error for a decider admit knows cannot decide (an
// *admit.Limiter built without a client), nil otherwise. Package admit
// sets it when it is initialised.
var Check func(decider any) error
