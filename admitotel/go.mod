module github.com/admitkit/admit/admitotel

go 1.26.0

require (
	github.com/admitkit/admit v0.0.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/metric v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/valkey-io/valkey-go v1.0.79 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

replace github.com/admitkit/admit => ../
