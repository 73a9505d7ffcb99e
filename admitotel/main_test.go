package admitotel_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/admitkit/admit/admittest"
)

// server starts a server of the test's own and returns a client of it and
// a function that kills the server; it skips without a server binary
// unless ADMIT_REQUIRE_SERVER=1.
func server(t testing.TB) (valkey.Client, func()) {
	t.Helper()
	addr, stop, err := admittest.StartServer()
	if errors.Is(err, admittest.ErrNoServer) && os.Getenv("ADMIT_REQUIRE_SERVER") != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, stop
}

// meter returns a MeterProvider and its manual reader.
func meter() (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	r := sdkmetric.NewManualReader()
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), r
}

// A series is one data point: its instrument and its attributes, as
// "name{k=v,...}".
type series = string

// collect returns every sum data point by series (counters and
// UpDownCounters) and every histogram's count by series.
func collect(t testing.TB, r *sdkmetric.ManualReader) map[series]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[series]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[name(m.Name, p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[name(m.Name, p.Attributes)] += int64(p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return got
}

func name(instrument string, set attribute.Set) series {
	s := instrument + "{"
	for i, kv := range set.ToSlice() {
		if i > 0 {
			s += ","
		}
		s += string(kv.Key) + "=" + kv.Value.String()
	}
	return s + "}"
}

// ctx returns a context that ends with the test, within a minute.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}
