module github.com/admitkit/admit/admitgrpc

go 1.26.0

require (
	github.com/admitkit/admit v0.0.0
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/valkey-io/valkey-go v1.0.79
	golang.org/x/time v0.16.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

replace github.com/admitkit/admit => ../
