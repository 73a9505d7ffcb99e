//go:build !linux

package admit

import "syscall"

func serverProcAttr() *syscall.SysProcAttr { return nil }
