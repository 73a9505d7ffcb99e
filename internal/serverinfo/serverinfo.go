// Package serverinfo reads what a Valkey or Redis server says about itself
// (INFO fields, command counters) and deletes a prefix's keys: the helpers
// that the conformance suite (admittest) and the tests' server launcher
// (internal/testserver) share.
package serverinfo

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Fields parses the "name:value" lines of an INFO (or CLUSTER INFO)
// reply.
func Fields(info string) map[string]string {
	info = strings.TrimPrefix(info, "txt:") // a RESP3 verbatim string, as CLUSTER INFO sends
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// CmdStat is one command's line of INFO commandstats.
type CmdStat struct{ Calls, Usec, Failed, Rejected int64 }

// Stats is INFO commandstats by lower-case command name ("evalsha",
// "eval", "ping", ...).
type Stats map[string]CmdStat

// ScriptCalls is the number of script commands (EVALSHA and EVAL) counted
// from s0 to s.
func (s Stats) ScriptCalls(s0 Stats) int64 {
	return s["evalsha"].Calls - s0["evalsha"].Calls + s["eval"].Calls - s0["eval"].Calls
}

// CommandStats reads INFO commandstats from c. On Valkey 8 and Redis 7 the
// counters are per node, so read them from the node that served the calls.
func CommandStats(ctx context.Context, c valkey.Client) (Stats, error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	stats := Stats{}
	for k, v := range Fields(info) {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var s CmdStat
		for kv := range strings.SplitSeq(v, ",") {
			key, val, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch key {
			case "calls":
				s.Calls = n
			case "usec":
				s.Usec = n
			case "failed_calls":
				s.Failed = n
			case "rejected_calls":
				s.Rejected = n
			}
		}
		stats[name] = s
	}
	return stats, nil
}

// DeleteWithPrefix deletes every key that starts with prefix, on every
// node of c, and nothing else: SCAN MATCH, then DEL, bounded in count and
// time. prefix must hold no glob characters.
func DeleteWithPrefix(c valkey.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, node := range c.Nodes() {
		var cursor uint64
		for range 10000 {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				break
			}
			for _, k := range e.Elements {
				node.Do(ctx, node.B().Del().Key(k).Build())
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
}
