// Package aclrules holds docs/acl.md's least-privilege ACL for admit, which
// the tests and the conformance suite create their users from, so that
// what they test is what the docs tell users to grant.
package aclrules

// Buckets is what a user needs for every bucket call (AllowOrdered,
// AllowAll, Peek, Refund, Wait) and AllowOrderedOnce's record: docs/acl.md,
// without the key pattern.
const Buckets = "-@all +evalsha +eval +evalsha_ro +eval_ro +time +hmget +hset +pexpireat +exists +get +set"

// Leases is what a user needs for leases beside Buckets (docs/leases.md).
const Leases = "+zscore +zcard +zcount +zrange +zadd +zremrangebyscore +zrem"

// LeastPrivilege is Buckets and Leases: every call admit makes.
const LeastPrivilege = Buckets + " " + Leases
