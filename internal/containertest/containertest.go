// Package containertest starts Valkey and Redis servers in containers through
// testcontainers-go, for admit's conformance suite. It is a module of its
// own, so that importing admit costs nothing of testcontainers-go, Docker or
// OpenTelemetry.
//
// Its tests run the suite (package admittest) on the image VALKEY_IMAGE
// names, for example
//
//	VALKEY_IMAGE=valkey/valkey:8.0 go test ./...
//
// and skip when VALKEY_IMAGE is unset. Any image whose default command starts
// a Valkey or Redis server listening on port 6379 works: the official valkey
// and redis images, or one imported from a local server binary where no
// registry is reachable (see docs/testing.md, "Testing in containers").
package containertest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/admitkit/admit/internal/testserver"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Start runs image, waits until its port 6379 accepts connections, and
// returns the mapped address and a function that removes the container. args,
// if any, replace the image's command arguments. The error wraps
// testserver.ErrNoEngine when no Docker engine answers.
func Start(ctx context.Context, image string, args ...string) (addr string, stop func(), err error) {
	if err := engineHealth(ctx); err != nil {
		return "", nil, fmt.Errorf("%w: %v", testserver.ErrNoEngine, err)
	}
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithExposedPorts("6379/tcp"),
		// The log line, not a check inside the container, which would need a
		// shell and tools that a minimal image lacks; then the mapped port.
		testcontainers.WithWaitStrategy(wait.ForAll(
			wait.ForLog("Ready to accept connections"),
			wait.ForListeningPort("6379/tcp").SkipInternalCheck(),
		).WithDeadline(time.Minute)),
	}
	if len(args) > 0 {
		opts = append(opts, testcontainers.WithCmdArgs(args...))
	}
	ctr, err := testcontainers.Run(ctx, image, opts...)
	stop = func() { testcontainers.TerminateContainer(ctr) }
	if err != nil {
		stop()
		return "", nil, err
	}
	ep, err := ctr.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		stop()
		return "", nil, err
	}
	return strings.TrimPrefix(ep, "tcp://"), stop, nil
}

// engineHealth asks the Docker engine testcontainers-go would use whether it
// answers. testcontainers-go panics in some set-ups without an engine, hence
// the recover.
func engineHealth(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return err
	}
	return nil
}
