package fleetenv

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// A Command is one of outgress's subcommands: its flag set, named after
// it, and how it reports a failure and learns it must stop.
type Command struct {
	*flag.FlagSet
	// Fleet are the fleet's flags, for a command made by NewFleetCommand.
	Fleet Flags
	// Out and Err are where the command writes its output and its
	// failures: os.Stdout and os.Stderr unless a test sets them (SetOutput).
	Out, Err io.Writer
	name     string
}

// SetOutput sends the command's output to out and its failures and
// usage (the flag set's too) to errOut.
func (c *Command) SetOutput(out, errOut io.Writer) {
	c.Out, c.Err = out, errOut
	c.FlagSet.SetOutput(errOut)
}

// NewCommand returns the subcommand name's flag set (errors returned, not
// exiting).
func NewCommand(name string) Command {
	return Command{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), Out: os.Stdout, Err: os.Stderr, name: name}
}

// NewFleetCommand is NewCommand with the fleet's flags (AddFlags) defined:
// a command that acts on a fleet's keys, subjects or stream.
func NewFleetCommand(name string) Command {
	c := NewCommand(name)
	c.Fleet = AddFlags(c.FlagSet)
	return c
}

// ParseEnv parses args, then reads the fleet's servers from the
// environment (Env): the error is the first of the two.
func (c Command) ParseEnv(args []string, needValkey bool) (valkeyAddr, natsURL string, err error) {
	if err := c.Parse(args); err != nil {
		return "", "", err
	}
	return Env(needValkey)
}

// Fail writes err to stderr, prefixed with the subcommand ("outgress
// publish: ..."), and returns code, the exit code.
func (c Command) Fail(code int, err error) int {
	fmt.Fprintf(c.Err, "outgress %s: %v\n", c.name, err)
	return code
}

// Usage writes the subcommand's usage line to stderr and returns 2, the
// exit code of bad usage.
func (c Command) Usage(line string) int {
	fmt.Fprintln(c.Err, "usage: "+line)
	return 2
}

// Context is the subcommand's context: it ends on an interrupt or a
// SIGTERM (a deployment stopping the process).
func (c Command) Context() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
