package nettest

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/miekg/dns"
)

// Upstream is a test DNS resolver: it answers A queries from a fixed table
// (and a TXT record for every name that has an A record) and records every
// question it was asked.
type Upstream struct {
	Addr netip.AddrPort

	records map[string][]netip.Addr
	mu      sync.Mutex
	asked   []string
}

// StartUpstream serves records (name -> IPv4 addresses) on 127.0.0.1, UDP
// and TCP, until the test ends.
func StartUpstream(t testing.TB, records map[string][]string) *Upstream {
	t.Helper()
	u := &Upstream{records: map[string][]netip.Addr{}}
	for name, ips := range records {
		for _, ip := range ips {
			u.records[dns.Fqdn(strings.ToLower(name))] = append(u.records[dns.Fqdn(strings.ToLower(name))], netip.MustParseAddr(ip))
		}
	}
	pc, ln := listenUDPAndTCP(t)
	u.Addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: ln, Handler: u}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
		})
	}
	return u
}

// ServeDNS answers from the table.
func (u *Upstream) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) == 1 {
		q := req.Question[0]
		name := strings.ToLower(q.Name)
		u.mu.Lock()
		u.asked = append(u.asked, strings.TrimSuffix(name, ".")+"/"+dns.TypeToString[q.Qtype])
		u.mu.Unlock()
		ips, ok := u.records[name]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			for _, ip := range ips {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: ip.AsSlice()})
			}
		case q.Qtype == dns.TypeTXT:
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 300}, Txt: []string{"payload"}})
		}
	}
	_ = w.WriteMsg(m)
}

// Asked returns the questions received so far, as "name/TYPE".
func (u *Upstream) Asked() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.asked...)
}

// listenUDPAndTCP listens on one loopback port for UDP and TCP alike. The
// kernel picks a free UDP port, which a TCP socket (another test's
// connection) may hold: then it tries another.
func listenUDPAndTCP(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for tries := 0; ; tries++ {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("upstream dns: %v", err)
		}
		ln, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
		if !errors.Is(err, syscall.EADDRINUSE) || tries == 20 {
			t.Fatalf("upstream dns: %v", err)
		}
	}
}
