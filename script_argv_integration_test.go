package admit

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/admitkit/admit/internal/testserver"
)

// TestIntegrationScriptRefusesBadArgv: a direct call with arguments admit
// never sends is refused before the first write, on a real server (whose
// Lua converts "nan", "inf" and "0x10" as numbers, unlike miniredis's).
func TestIntegrationScriptRefusesBadArgv(t *testing.T) {
	srv := testserver.Shared(t)
	c := testserver.NewClient(t, srv)
	prefix := testserver.Prefix(t, c)
	ctx := context.Background()
	snap := func() string {
		var b strings.Builder
		for _, k := range []string{"{t}b1", "{t}b2", "{t}rec"} {
			v, _ := c.Do(ctx, c.B().Dump().Key(prefix+k).Build()).ToString()
			ttl, _ := c.Do(ctx, c.B().Pexpiretime().Key(prefix+k).Build()).AsInt64()
			b.WriteString(k + " " + v + " " + strconv.FormatInt(ttl, 10) + "\n")
		}
		return b.String()
	}
	checkArgv(t, c, prefix, snap)
}
