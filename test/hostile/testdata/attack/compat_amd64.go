package main

// compatSupported: amd64 can make i386 system calls through int 0x80.
const compatSupported = true

// compatGetpid makes getpid (20 in the i386 table) through int 0x80 and
// returns the kernel's answer: a pid, or minus an errno.
func compatGetpid() int32
