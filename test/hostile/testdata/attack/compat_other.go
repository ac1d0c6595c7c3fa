//go:build !amd64

package main

const compatSupported = false

func compatGetpid() int32 { return 0 }
