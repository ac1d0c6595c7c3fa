// Package egress decides and carries a sandbox's outbound traffic: a DNS
// resolver that answers only allowed names and a proxy that reads the TLS
// SNI or HTTP Host (or a CONNECT target), checks the policy, and dials the
// name itself.
package egress

import _ "github.com/miekg/dns"
