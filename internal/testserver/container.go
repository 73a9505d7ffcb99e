package testserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcvalkey "github.com/testcontainers/testcontainers-go/modules/valkey"
)

// noDockerError says VALKEY_IMAGE was set where no Docker engine answers:
// the tests skip (or fail under ADMIT_REQUIRE_SERVER=1) instead of erroring.
type noDockerError struct{ image, cause string }

func (e *noDockerError) Error() string {
	return "VALKEY_IMAGE=" + e.image + " needs a Docker engine, and none answers: " + e.cause
}

// startContainer runs image through testcontainers-go's valkey module and
// returns it as an owned server, terminated by Stop.
func startContainer(image string) (srv *Server, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := dockerHealth(ctx); err != nil {
		return nil, &noDockerError{image: image, cause: err.Error()}
	}
	ctr, err := tcvalkey.Run(ctx, image)
	stop := func() { testcontainers.TerminateContainer(ctr) }
	if err != nil {
		stop()
		return nil, fmt.Errorf("VALKEY_IMAGE=%s: %w", image, err)
	}
	uri, err := ctr.ConnectionString(ctx)
	if err != nil {
		stop()
		return nil, fmt.Errorf("VALKEY_IMAGE=%s: %w", image, err)
	}
	addr := strings.TrimPrefix(uri, "redis://")
	v, err := serverVersion(addr)
	if err != nil {
		stop()
		return nil, fmt.Errorf("VALKEY_IMAGE=%s at %s: %w", image, addr, err)
	}
	return &Server{Addr: addr, Owned: true, Version: v, stop: stop}, nil
}

// dockerHealth asks the Docker engine testcontainers-go would use whether
// it answers. testcontainers-go panics in some set-ups without an engine,
// hence the recover.
func dockerHealth(ctx context.Context) (err error) {
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
	return p.Health(ctx)
}
