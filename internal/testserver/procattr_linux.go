package testserver

import "syscall"

// serverProcAttr kills a started server when the test binary dies, so a
// crashed test leaves no server behind.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
