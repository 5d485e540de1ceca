//go:build unix && !linux

package tempserver

import "syscall"

// dieWithParent: outside Linux there is no Pdeathsig, so the child outlives a
// parent that dies without Close.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
