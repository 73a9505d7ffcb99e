// Package scriptsource lets admittest read the Lua source a Limiter runs,
// which package admit does not export: the conformance rule
// "acl-precheck-arity" checks each ACL precheck in it against the server's
// own command table, so that a mutated copy of the script (TestMutants) is
// checked as the shipped one is.
package scriptsource

// Of returns the source of the script that l, an *admit.Limiter, runs
// for its takes, refunds and leases. Package admit sets it when it is
// initialised; it is nil in a program that does not import admit.
var Of func(l any) string
