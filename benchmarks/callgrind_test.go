package benchmarks

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// callgrindScope is ADMIT_BENCH_CALLGRIND: empty, BenchmarkScriptServerTime
// reads the server's own time per call (INFO commandstats); set, it counts
// the server's instructions per call instead, with the server run under
// valgrind --tool=callgrind, counting only inside the server function it
// names ("1" names evalShaCommand: the script, the commands it runs and the
// Lua garbage collector's steps, as commandstats' usec for EVALSHA times
// them; processCommand adds the command's dispatch). A count, not a time,
// so it repeats whatever else the machine does.
func callgrindScope() string {
	s := os.Getenv("ADMIT_BENCH_CALLGRIND")
	if s == "1" {
		return "evalShaCommand"
	}
	return s
}

// callgrindCalls is how many EVALSHAs a run sends under callgrind, one at a
// time on one connection.
const callgrindCalls = 3000

// A callgrind is a server running under valgrind --tool=callgrind.
type callgrind struct {
	pid   int
	dir   string // where callgrind writes its dumps
	dumps int    // dumps written so far
}

// startCallgrind starts bin (a server binary, or a shell wrapper that execs
// one, which valgrind then follows) under callgrind on a free port of
// 127.0.0.1, counting only inside scope, and returns its address. It is
// stopped when b ends.
func startCallgrind(b *testing.B, bin, scope string) (string, *callgrind) {
	b.Helper()
	if _, err := exec.LookPath("callgrind_control"); err != nil {
		b.Fatal("ADMIT_BENCH_CALLGRIND needs valgrind (valgrind and callgrind_control on PATH)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir := b.TempDir()
	args := []string{"--tool=callgrind", "--toggle-collect=" + scope,
		"--callgrind-out-file=" + filepath.Join(dir, "cg.out"), "--dump-instr=no"}
	if head, err := os.ReadFile(bin); err == nil && strings.HasPrefix(string(head), "#!") {
		args = append(args, "--trace-children=yes")
	}
	args = append(args, bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd := exec.Command("valgrind", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	addr := net.JoinHostPort("127.0.0.1", port)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			b.Fatalf("%s under callgrind did not listen on %s within a minute:\n%s", bin, addr, out)
		}
	}
	return addr, &callgrind{pid: cmd.Process.Pid, dir: dir}
}

// zero sets the instruction counters to zero.
func (g *callgrind) zero(b *testing.B) {
	b.Helper()
	if out, err := exec.Command("callgrind_control", "-z", strconv.Itoa(g.pid)).CombinedOutput(); err != nil {
		b.Fatalf("callgrind_control -z: %v\n%s", err, out)
	}
}

// perCall dumps the counters and returns the instructions since zero,
// over calls.
func (g *callgrind) perCall(b *testing.B, calls int64) float64 {
	b.Helper()
	exec.Command("callgrind_control", "-d", strconv.Itoa(g.pid)).Run()
	g.dumps++
	path := filepath.Join(g.dir, fmt.Sprintf("cg.out.%d", g.dumps))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if n, ok := dumpTotal(path); ok {
			return float64(n) / float64(calls)
		}
		if time.Now().After(deadline) {
			b.Fatalf("callgrind wrote no dump %s within 30 s", path)
		}
	}
}

// dumpTotal reads the instruction total of a callgrind dump, once it is
// written whole.
func dumpTotal(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "summary:"); ok {
			n, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n, err == nil
		}
		if rest, ok := strings.CutPrefix(line, "totals:"); ok {
			n, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
