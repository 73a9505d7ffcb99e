//go:build !race

package benchmarks

// raceEnabled: the race detector changes what allocates, so allocation
// budgets are not checked under it.
const raceEnabled = false
