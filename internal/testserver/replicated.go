package testserver

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

// ReplicatedCluster is a Valkey Cluster the tests started: n primaries,
// each with one replica.
type ReplicatedCluster struct {
	// Primaries[i] serves the i-th n-th of the slots; Replicas[i]
	// replicates it (as started: a failover swaps their roles).
	Primaries, Replicas []*Server
	Version             string
}

// Addrs returns the address of every primary, as started.
func (c *ReplicatedCluster) Addrs() []string {
	addrs := make([]string, len(c.Primaries))
	for i, s := range c.Primaries {
		addrs[i] = s.Addr
	}
	return addrs
}

// Stop stops every server of the cluster.
func (c *ReplicatedCluster) Stop() {
	for _, s := range append(append([]*Server(nil), c.Primaries...), c.Replicas...) {
		s.Stop()
	}
}

// StartReplicatedCluster starts 2n cluster-enabled servers of bin on
// 127.0.0.1 with a cluster-node-timeout of nodeTimeout, gives n of them an
// equal range of the slots, joins all, makes each other one the replica of
// a primary (CLUSTER REPLICATE), and waits, at most 60 s, until every node
// reports cluster_state:ok, knows all 2n nodes and serves n slot ranges of
// two nodes each, and every replica's link to its primary is up. The
// caller stops it.
func StartReplicatedCluster(bin string, n int, nodeTimeout time.Duration) (_ *ReplicatedCluster, err error) {
	c := &ReplicatedCluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	for i := range 2 * n {
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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	for i := range n {
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
			return nil, fmt.Errorf("replicated cluster not ready within 60s: %w", notReady)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
