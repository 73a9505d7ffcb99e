//go:build !linux

package testserver

import "syscall"

func serverProcAttr() *syscall.SysProcAttr { return nil }
