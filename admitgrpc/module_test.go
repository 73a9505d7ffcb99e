package admitgrpc_test

import (
	"os"
	"strings"
	"testing"
)

// TestRootModuleStaysFree: gRPC and x/time/rate (this module's benchmark)
// are this module's dependencies, never the root module's, whose go.mod is
// what every importer of admit pays for.
func TestRootModuleStaysFree(t *testing.T) {
	root, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(root), "module github.com/admitkit/admit\n") {
		t.Fatalf("../go.mod is not admit's root module:\n%s", root)
	}
	for _, dep := range []string{"google.golang.org/grpc", "google.golang.org/genproto", "google.golang.org/protobuf", "golang.org/x/time"} {
		if strings.Contains(string(root), dep) {
			t.Errorf("the root go.mod names %s; it belongs in a nested module", dep)
		}
	}
	own, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(own), "google.golang.org/grpc ") {
		t.Fatal("this module's go.mod does not require google.golang.org/grpc: the check above would pass vacuously")
	}
}
