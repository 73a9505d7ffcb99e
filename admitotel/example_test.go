package admitotel_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valkey-io/valkey-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admitotel"
)

// A Limiter's decisions exported to Prometheus: one line wires the
// observer; the MeterProvider and its exporter are the application's. This
// example starts its own in-process server; in production, pass your
// valkey.Client to admit.New, and serve promhttp's handler on /metrics.
func ExampleNewObserver() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))

	observe, err := admitotel.NewObserver(mp, admitotel.WithPolicy(func(key string) string {
		policy, _, _ := strings.Cut(key, ":") // "api" for "api:user:7": a name, never the key
		return policy
	}))
	if err != nil {
		log.Fatal(err)
	}
	lim := admit.New(client, admit.WithObserver(observe))

	perUser := admit.Request{Key: "api:user:7", Spec: admit.MustSpec(admit.Every(time.Minute), 2)}
	for range 3 {
		if _, err := lim.AllowOrdered(context.Background(), perUser, nil); err != nil {
			log.Fatal(err)
		}
	}

	// What a scrape of /metrics shows of the decisions.
	scrape := httptest.NewRecorder()
	promhttp.HandlerFor(registry, promhttp.HandlerOpts{}).ServeHTTP(scrape, httptest.NewRequest("GET", "/metrics", nil))
	lines := bufio.NewScanner(scrape.Body)
	for lines.Scan() {
		if line := lines.Text(); strings.Contains(line, "admit_client_decisions") || strings.HasPrefix(line, "db_client_operation_duration_seconds_count") {
			fmt.Println(line)
		}
	}
	// Output:
	// # HELP admit_client_decisions_total Calls of an admit Limiter, refunds aside, by operation and outcome.
	// # TYPE admit_client_decisions_total counter
	// admit_client_decisions_total{admit_outcome="allowed",admit_policy="api",db_operation_name="take"} 2
	// admit_client_decisions_total{admit_denied_by="first",admit_outcome="denied",admit_policy="api",db_operation_name="take"} 1
	// db_client_operation_duration_seconds_count{admit_policy="api",db_operation_name="take",db_system_name="valkey"} 3
}
