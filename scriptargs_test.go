package admit

import "strconv"

// takeArgs are the arguments AllowOrdered sends for specs, each at cost 1:
// 3 a bucket and no mode.
func takeArgs(specs ...Spec) []string {
	var args []string
	for _, s := range specs {
		args = append(args, s.intervalArg, s.burstArg, "1")
	}
	return args
}

// baselineArgs are the arguments the 0b7bc55 script took for specs: µs per
// token, burst and expiry in milliseconds, a bucket.
func baselineArgs(specs ...Spec) []string {
	var args []string
	for _, s := range specs {
		args = append(args, s.intervalArg, s.burstArg, strconv.FormatInt(s.TTL().Milliseconds(), 10))
	}
	return args
}
