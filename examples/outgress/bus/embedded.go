package bus

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is an in-process nats-server with JetStream, listening on
// 127.0.0.1 on a free port, its store in a temporary directory.
type Embedded struct {
	srv *server.Server
	dir string
}

// StartEmbedded starts the server and waits until it accepts connections.
func StartEmbedded() (*Embedded, error) {
	dir, err := os.MkdirTemp("", "outgress-nats-")
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("bus: embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		os.RemoveAll(dir)
		return nil, errors.New("bus: embedded NATS not ready within 10s")
	}
	return &Embedded{srv: srv, dir: dir}, nil
}

// URL is the address clients dial, for example nats://127.0.0.1:41234.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Close shuts the server down and removes its store.
func (e *Embedded) Close() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	os.RemoveAll(e.dir)
}

// SlowConsumers is the server's count of slow consumers: clients it cut off
// because they did not read what it sent them in time.
func (e *Embedded) SlowConsumers() int64 { return e.srv.NumSlowConsumers() }
