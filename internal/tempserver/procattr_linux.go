package tempserver

import "syscall"

// dieWithParent makes a child that the kernel kills when its parent dies: a
// crashed test or a killed `delayq dev` leaves no server behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
