// Command nettool is a static helper the e2e tests copy into sandboxes
// whose busybox userland lacks a modern TLS client or a WebSocket server.
//
//	nettool get URL     GET URL (HTTP_PROXY/HTTPS_PROXY honoured, the
//	                    certificate not checked), print the body
//	nettool serve PORT  serve HTTP on 0.0.0.0:PORT: /ws echoes WebSocket
//	                    text messages, anything else prints the request
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/coder/websocket"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: nettool get URL | serve PORT")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "get":
		err = get(os.Args[2])
	case "serve":
		err = serve(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nettool:", err)
		os.Exit(1)
	}
}

func get(url string) error {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// The tests judge the SNI and the Host; trust is not the point.
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	resp, err := (&http.Client{Transport: tr}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

func serve(port string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "sandbox server: %s %s host=%s auth=%s\n", r.Method, r.URL.RequestURI(), r.Host, r.Header.Get("Authorization"))
	})
	return http.ListenAndServe(":"+port, mux)
}
