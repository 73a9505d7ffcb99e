package testserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Target is a deployment the conformance suite runs against: one server or
// a cluster.
type Target struct {
	// Name describes the target for logs, for example
	// "valkey 8.0.1, 3-primary cluster, started by the tests".
	Name string
	// Addrs are the addresses to give valkey.ClientOption.InitAddress.
	Addrs []string
	// Cluster is true for a Valkey Cluster.
	Cluster bool
	// Owned is true when the tests started the server(s) themselves.
	Owned bool
	// Version is the server's version, for example "valkey 8.0.1".
	Version string
}

// Destructive reports whether checks that change server-wide state (SCRIPT
// FLUSH) may run, and whether the server may be taken to be quiet, so that
// its command counters move only with the suite's own commands: on a server
// the tests started, or when VALKEY_ALLOW_DESTRUCTIVE=1 says the server is
// the suite's alone.
func (t *Target) Destructive() bool {
	return t.Owned || os.Getenv("VALKEY_ALLOW_DESTRUCTIVE") == "1"
}

// sharedCluster is the cluster VALKEY_CLUSTER=1 starts; nil without a
// server binary.
var sharedCluster once[*Cluster]

// Deployment returns the target of the conformance suite:
// VALKEY_CLUSTER_ADDR, else a cluster started once when VALKEY_CLUSTER=1,
// else the [Shared] server.
func Deployment(tb testing.TB) *Target {
	tb.Helper()
	if list := os.Getenv("VALKEY_CLUSTER_ADDR"); list != "" {
		addrs := strings.Split(list, ",")
		v, err := serverVersion(addrs[0])
		if err != nil {
			tb.Fatalf("VALKEY_CLUSTER_ADDR=%s: %v", list, err)
		}
		tally(tb, "ran")
		return &Target{Name: v + ", cluster at " + list, Addrs: addrs, Cluster: true, Version: v}
	}
	if os.Getenv("VALKEY_CLUSTER") == "1" {
		c, err := sharedCluster.get(func() (*Cluster, error) {
			if bin := Binary(); bin != "" {
				return StartCluster(bin, 3)
			}
			return nil, nil
		})
		if err != nil {
			tb.Fatalf("cluster: %v", err)
		}
		if c == nil {
			SkipOrFail(tb, "VALKEY_CLUSTER=1 needs a server binary: "+Help)
		}
		tally(tb, "ran")
		return &Target{
			Name:  fmt.Sprintf("%s, %d-primary cluster, started by the tests", c.Version, len(c.Primaries)),
			Addrs: c.Addrs(), Cluster: true, Owned: true, Version: c.Version,
		}
	}
	srv := Shared(tb)
	how := "at " + srv.Addr
	if srv.Owned {
		how = "started by the tests"
	}
	return &Target{Name: srv.Version + ", standalone, " + how, Addrs: []string{srv.Addr}, Owned: srv.Owned, Version: srv.Version}
}

// Cluster is a Valkey Cluster the tests started: n primaries, each with
// one replica or none.
type Cluster struct {
	// Primaries[i] serves the i-th n-th of the slots; Replicas[i], if
	// any, replicates it (as started: a failover swaps their roles).
	Primaries, Replicas []*Server
	Version             string
}

// Addrs returns the address of every primary, as started.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Primaries))
	for i, s := range c.Primaries {
		addrs[i] = s.Addr
	}
	return addrs
}

// Stop stops every server of the cluster.
func (c *Cluster) Stop() {
	for _, s := range append(append([]*Server(nil), c.Primaries...), c.Replicas...) {
		s.Stop()
	}
}

// StartCluster starts n cluster-enabled servers of bin on 127.0.0.1, gives
// each an equal range of the 16384 slots (CLUSTER ADDSLOTSRANGE), joins them
// (CLUSTER MEET), and waits, at most 30 s, until every node reports
// cluster_state:ok and the same slot map. The caller stops it.
func StartCluster(bin string, n int) (*Cluster, error) {
	return startCluster(bin, n, false, 5*time.Second, 30*time.Second)
}

// StartReplicatedCluster starts 2n cluster-enabled servers of bin on
// 127.0.0.1 with a cluster-node-timeout of nodeTimeout, gives n of them an
// equal range of the slots, joins all, makes each other one the replica of
// a primary (CLUSTER REPLICATE), and waits, at most 60 s, until every node
// reports cluster_state:ok, knows all 2n nodes and serves n slot ranges of
// two nodes each, and every replica's link to its primary is up. The
// caller stops it.
func StartReplicatedCluster(bin string, n int, nodeTimeout time.Duration) (*Cluster, error) {
	return startCluster(bin, n, true, nodeTimeout, 60*time.Second)
}

// startCluster starts n primaries, and with replicas one replica of each,
// and waits at most wait until the cluster is ready (clusterReady).
func startCluster(bin string, n int, replicas bool, nodeTimeout, wait time.Duration) (_ *Cluster, err error) {
	c := &Cluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	nodes := n
	if replicas {
		nodes = 2 * n
	}
	for i := range nodes {
		srv, err := Start(bin, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		if err != nil {
			return nil, err
		}
		if i < n {
			c.Primaries = append(c.Primaries, srv)
		} else {
			c.Replicas = append(c.Replicas, srv)
		}
	}
	c.Version = c.Primaries[0].Version
	all := append(append([]*Server(nil), c.Primaries...), c.Replicas...)
	clients := make([]valkey.Client, len(all))
	for i, srv := range all {
		cl, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		clients[i] = cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i, cl := range clients[:n] {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := cl.Do(ctx, cl.B().Arbitrary("CLUSTER", "ADDSLOTSRANGE").Args(strconv.Itoa(lo), strconv.Itoa(hi)).Build()).Error(); err != nil {
			return nil, fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, all[i].Addr, err)
		}
	}
	for _, srv := range all[1:] {
		host, port, _ := strings.Cut(srv.Addr, ":")
		if err := clients[0].Do(ctx, clients[0].B().Arbitrary("CLUSTER", "MEET").Args(host, port, busPort(srv)).Build()).Error(); err != nil {
			return nil, fmt.Errorf("CLUSTER MEET %s: %w", srv.Addr, err)
		}
	}
	// A replica can replicate a primary only once it knows it.
	for i := range len(c.Replicas) {
		id, err := clients[i].Do(ctx, clients[i].B().ClusterMyid().Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("CLUSTER MYID on %s: %w", all[i].Addr, err)
		}
		r := clients[n+i]
		for {
			err := r.Do(ctx, r.B().ClusterReplicate().NodeId(id).Build()).Error()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("CLUSTER REPLICATE %s on %s: %w", id, all[n+i].Addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var notReady error
	for {
		if notReady = clusterReady(ctx, clients, n, notReady); notReady == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("cluster of %s not ready within %v: %w", strings.Join(c.Addrs(), ","), wait, notReady)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// busPort returns the --cluster-port the server was started with.
func busPort(s *Server) string {
	for i, a := range s.cmd.Args {
		if a == "--cluster-port" && i+1 < len(s.cmd.Args) {
			return s.cmd.Args[i+1]
		}
	}
	return ""
}

// clusterReady reports nil once every node says cluster_state:ok, knows
// every other node, and serves a slot map with one range per primary;
// clients are the primaries, then their replicas, if any: then every range
// also lists its replica, and every replica's link to its primary is up.
// last is the previous answer, kept when the deadline cuts a probe short.
func clusterReady(ctx context.Context, clients []valkey.Client, primaries int, last error) error {
	for i, cl := range clients {
		info, err := cl.Do(ctx, cl.B().ClusterInfo().Build()).ToString()
		if ctx.Err() != nil && last != nil {
			return last
		}
		if err != nil {
			return err
		}
		f := InfoFields(info)
		if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(len(clients)) {
			return fmt.Errorf("cluster_state:%s cluster_known_nodes:%s", f["cluster_state"], f["cluster_known_nodes"])
		}
		slots, err := cl.Do(ctx, cl.B().ClusterSlots().Build()).ToArray()
		if err != nil {
			return err
		}
		if len(slots) != primaries {
			return errors.New("slot map not yet complete on every node")
		}
		if primaries == len(clients) {
			continue
		}
		for _, s := range slots {
			if f, _ := s.ToArray(); len(f) != 4 { // lo, hi, primary, one replica
				return errors.New("a slot range without its replica")
			}
		}
		if i >= primaries {
			repl, err := cl.Do(ctx, cl.B().Info().Section("replication").Build()).ToString()
			if err != nil {
				return err
			}
			if f := InfoFields(repl); f["master_link_status"] != "up" {
				return fmt.Errorf("replica link %s", f["master_link_status"])
			}
		}
	}
	return nil
}
