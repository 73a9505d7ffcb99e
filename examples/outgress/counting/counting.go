// Package counting wraps a valkey.Client to count what is sent through
// it: commands and round trips in total, and into the Tally a call's
// context carries, so that the demo can attribute Valkey commands to the
// message that caused them. Tests use its Gate, Fault and Lose hooks to
// hold a command, fail it without sending it, or lose its reply.
package counting

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Client is a valkey.Client that counts what is sent through it:
// every command and round trip in total, and also into the Tally carried by
// the call's context, if any. The demo uses it to attribute Valkey commands
// to the message that caused them; the tests use it to prove that a path
// sends nothing. (The tests' exact per-path counts come from the server's
// INFO commandstats instead.)
type Client struct {
	valkey.Client
	commands, roundTrips atomic.Int64
	// Gate, if set, runs before each Do; tests use it to hold a command.
	Gate func(cmd valkey.Completed)
	// Fault, if set, runs before each Do; a non-nil error is returned as
	// the command's result and the command is not sent (nor counted). The
	// demo uses it to show admit's two error classes.
	Fault func(cmd valkey.Completed) error
	// Lose, if set, runs before each Do; when it returns an error the
	// command is still sent and its reply read, then the error replaces
	// the reply, as when the connection drops after the server ran the
	// command and before its reply arrived. Tests and the demo use it to
	// lose a decision that was made.
	Lose func(cmd valkey.Completed) error
}

// Tally counts the commands and round trips of one unit of work.
type Tally struct{ Commands, RoundTrips atomic.Int64 }

type tallyKey struct{}

// WithTally returns a context whose calls through a Client are
// counted into t.
func WithTally(ctx context.Context, t *Tally) context.Context {
	return context.WithValue(ctx, tallyKey{}, t)
}

// Totals returns the commands and round trips counted so far.
func (c *Client) Totals() (commands, roundTrips int64) {
	return c.commands.Load(), c.roundTrips.Load()
}

func (c *Client) count(ctx context.Context, commands int) {
	c.commands.Add(int64(commands))
	c.roundTrips.Add(1)
	if t, ok := ctx.Value(tallyKey{}).(*Tally); ok {
		t.Commands.Add(int64(commands))
		t.RoundTrips.Add(1)
	}
}

// Do counts one command and one round trip.
func (c *Client) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if c.Gate != nil {
		c.Gate(cmd)
	}
	if c.Fault != nil {
		if err := c.Fault(cmd); err != nil {
			return valkey.NewErrorResult(err)
		}
	}
	c.count(ctx, 1)
	if c.Lose == nil {
		return c.Client.Do(ctx, cmd)
	}
	// Do recycles cmd once it is sent, so the hook sees it first.
	lose := c.Lose(cmd)
	res := c.Client.Do(ctx, cmd)
	if lose != nil {
		return valkey.NewErrorResult(lose)
	}
	return res
}

// DoMulti counts len(multi) commands in one round trip.
func (c *Client) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	c.count(ctx, len(multi))
	return c.Client.DoMulti(ctx, multi...)
}

// DoCache counts one command and one round trip (a cache hit would send
// nothing; the demo disables the client cache).
func (c *Client) DoCache(ctx context.Context, cmd valkey.Cacheable, ttl time.Duration) valkey.ValkeyResult {
	c.count(ctx, 1)
	return c.Client.DoCache(ctx, cmd, ttl)
}

// Receive counts the SUBSCRIBE as one command.
func (c *Client) Receive(ctx context.Context, subscribe valkey.Completed, fn func(valkey.PubSubMessage)) error {
	c.count(ctx, 1)
	return c.Client.Receive(ctx, subscribe, fn)
}
