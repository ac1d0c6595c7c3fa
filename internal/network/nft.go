package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// nft manages the Manager's one inet table: shared base chains and verdict
// maps, plus three chains per sandbox. Every change is one netlink batch,
// which the kernel commits atomically: a sandbox never runs under half a
// ruleset. A fresh netlink socket serves each batch, so calls from
// different goroutines never mix their messages.
type nft struct {
	table  *nftables.Table
	prefix string
	subnet netip.Prefix
}

func newNFT(table, prefix string, subnet netip.Prefix) *nft {
	return &nft{table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}, prefix: prefix, subnet: subnet}
}

// baseChains are the hooked chains, in creation order.
func (n *nft) baseChains() []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return []*nftables.Chain{
		{Name: chainRefuse, Table: n.table},
		{Name: chainPrerouting, Table: n.table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		{Name: chainInput, Table: n.table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: chainForward, Table: n.table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: chainPostrouting, Table: n.table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
	}
}

func (n *nft) vmapSet(name string) *nftables.Set {
	// KeyByteOrder only tells nft(8) how to print the names.
	return &nftables.Set{Table: n.table, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}
}

// ensureBase creates the table, its maps and base chains if missing, and
// rewrites the base chains' rules (flush and add in one batch), which
// repairs a table someone edited. Sandbox chains and map entries are kept.
func (n *nft) ensureBase() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.AddTable(n.table)
	for _, m := range []string{mapPre, mapIn, mapFwd} {
		if err := c.AddSet(n.vmapSet(m), nil); err != nil {
			return fmt.Errorf("adding map %s: %w", m, err)
		}
	}
	rules := baseRules(n.prefix, n.subnet)
	for _, ch := range n.baseChains() {
		c.AddChain(ch)
		c.FlushChain(ch)
		for _, rl := range rules[ch.Name] {
			c.AddRule(&nftables.Rule{Table: n.table, Chain: ch, Exprs: rl.exprs()})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing nftables table %s: %w", n.table.Name, err)
	}
	return nil
}

// applySandbox creates or replaces a sandbox's chains and points the
// verdict maps at them for iface, in one atomic batch: on a live sandbox
// the old rules apply until the commit and the new ones right after.
func (n *nft) applySandbox(id, iface string, rules map[chainKind][]rule) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, k := range sandboxChainKinds() {
		ch := &nftables.Chain{Name: sandboxChain(id, k.kind), Table: n.table}
		c.AddChain(ch)
		c.FlushChain(ch)
		for _, rl := range rules[k.kind] {
			c.AddRule(&nftables.Rule{Table: n.table, Chain: ch, Exprs: rl.exprs()})
		}
	}
	for _, k := range sandboxChainKinds() {
		el := nftables.SetElement{Key: ifnameKey(iface), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: sandboxChain(id, k.kind)}}
		if err := c.SetAddElements(n.vmapSet(k.vmap), []nftables.SetElement{el}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing nftables rules of sandbox %s: %w", id, err)
	}
	return nil
}

// removeSandbox deletes a sandbox's map entries and chains. The common
// case is one batch; if something was already gone (a partial setup, an
// earlier teardown) the batch fails as a whole and each object is removed
// on its own, ignoring the missing ones. Removing nothing is not an error.
func (n *nft) removeSandbox(id, iface string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if iface != "" {
		for _, k := range sandboxChainKinds() {
			if err := c.SetDeleteElements(n.vmapSet(k.vmap), []nftables.SetElement{{Key: ifnameKey(iface)}}); err != nil {
				return err
			}
		}
		for _, k := range sandboxChainKinds() {
			ch := &nftables.Chain{Name: sandboxChain(id, k.kind), Table: n.table}
			c.FlushChain(ch)
			c.DelChain(ch)
		}
		if c.Flush() == nil {
			return nil
		}
	}
	return n.removeSandboxSlowly(id)
}

// removeBatch is the most sandboxes removeSandboxes deletes in one
// commit: the kernel acknowledges every message of a batch, and a few
// hundred acknowledgements overflow the netlink socket's receive buffer
// (ENOBUFS), which would fail the whole batch.
const removeBatch = 16

// removeSandboxes is removeSandbox for many sandboxes, in one commit per
// removeBatch of them when everything is there (one RCU grace period per
// commit instead of one per sandbox).
func (n *nft) removeSandboxes(items []reapItem) error {
	var errs []error
	for chunk := range slices.Chunk(items, removeBatch) {
		if err := n.removeChunk(chunk); err != nil {
			for _, it := range chunk {
				errs = append(errs, n.removeSandbox(it.id, it.iface))
			}
		}
	}
	return errors.Join(errs...)
}

func (n *nft) removeChunk(chunk []reapItem) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	keys := make([]nftables.SetElement, 0, len(chunk))
	for _, it := range chunk {
		keys = append(keys, nftables.SetElement{Key: ifnameKey(it.iface)})
	}
	for _, k := range sandboxChainKinds() {
		if err := c.SetDeleteElements(n.vmapSet(k.vmap), keys); err != nil {
			return err
		}
	}
	for _, it := range chunk {
		for _, k := range sandboxChainKinds() {
			ch := &nftables.Chain{Name: sandboxChain(it.id, k.kind), Table: n.table}
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	return c.Flush()
}

func (n *nft) removeSandboxSlowly(id string) error {
	var errs []error
	for _, k := range sandboxChainKinds() {
		chain := sandboxChain(id, k.kind)
		c, err := nftables.New()
		if err != nil {
			return err
		}
		set := n.vmapSet(k.vmap)
		elems, err := c.GetSetElements(set)
		if err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("listing map %s: %w", k.vmap, err))
		}
		var mine []nftables.SetElement
		for _, e := range elems {
			if elementChain(e) == chain {
				mine = append(mine, nftables.SetElement{Key: e.Key})
			}
		}
		if len(mine) > 0 {
			if err := c.SetDeleteElements(set, mine); err != nil {
				return err
			}
			if err := c.Flush(); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("deleting map %s entries for %s: %w", k.vmap, chain, err))
			}
		}
		ch := &nftables.Chain{Name: chain, Table: n.table}
		c.FlushChain(ch)
		c.DelChain(ch)
		if err := c.Flush(); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("deleting chain %s: %w", chain, err))
		}
	}
	return errors.Join(errs...)
}

// elementChain returns the chain a verdict map element jumps to. The
// nftables library leaves verdict data of listed elements undecoded in
// Val: the netlink attributes nested in NFTA_DATA_VERDICT, of which
// NFTA_VERDICT_CHAIN holds the NUL-terminated chain name.
func elementChain(e nftables.SetElement) string {
	if e.VerdictData != nil {
		return e.VerdictData.Chain
	}
	b := e.Val
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ unix.NLA_F_NESTED
		if n < 4 || n > len(b) {
			return ""
		}
		if typ == unix.NFTA_VERDICT_CHAIN {
			return strings.TrimRight(string(b[4:n]), "\x00")
		}
		b = b[min(len(b), (n+3)&^3):]
	}
	return ""
}

// sandboxIDs lists the ids that own chains in the table.
func (n *nft) sandboxIDs() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing nftables chains: %w", err)
	}
	seen := map[string]bool{}
	var ids []string
	for _, ch := range chains {
		if ch.Table.Name != n.table.Name {
			continue
		}
		rest, ok := strings.CutPrefix(ch.Name, "sb-")
		if !ok {
			continue
		}
		for _, k := range sandboxChainKinds() {
			if id, ok := strings.CutSuffix(rest, "-"+string(k.kind)); ok && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// deleteTable removes the table and everything in it; a missing table is
// not an error.
func (n *nft) deleteTable() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(n.table)
	if err := c.Flush(); err != nil && !isNotExist(err) {
		return fmt.Errorf("deleting nftables table %s: %w", n.table.Name, err)
	}
	return nil
}

// tableExists reports whether the table is present.
func (n *nft) tableExists() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	_, err = c.ListTableOfFamily(n.table.Name, nftables.TableFamilyINet)
	if isNotExist(err) {
		return false, nil
	}
	return err == nil, err
}

func isNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }

// render prints the ruleset of a table in nft syntax, for golden files and
// failure messages. It is built from the same rules the kernel gets.
func render(table, prefix string, subnet netip.Prefix, sandboxes []renderedSandbox) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", table)
	for _, m := range []string{mapPre, mapIn, mapFwd} {
		fmt.Fprintf(&b, "\tmap %s {\n\t\ttype ifname : verdict\n", m)
		var elems []string
		for _, sb := range sandboxes {
			for _, k := range sandboxChainKinds() {
				if k.vmap == m {
					elems = append(elems, fmt.Sprintf("%q : jump %s", sb.iface, sandboxChain(sb.id, k.kind)))
				}
			}
		}
		if len(elems) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(elems, ", "))
		}
		b.WriteString("\t}\n")
	}
	base := baseRules(prefix, subnet)
	hooks := map[string]string{
		chainPrerouting:  "type nat hook prerouting priority dstnat; policy accept;",
		chainInput:       "type filter hook input priority filter; policy accept;",
		chainForward:     "type filter hook forward priority filter; policy accept;",
		chainPostrouting: "type nat hook postrouting priority srcnat; policy accept;",
	}
	for _, ch := range []string{chainRefuse, chainPrerouting, chainInput, chainForward, chainPostrouting} {
		fmt.Fprintf(&b, "\tchain %s {\n", ch)
		if h := hooks[ch]; h != "" {
			fmt.Fprintf(&b, "\t\t%s\n", h)
		}
		for _, rl := range base[ch] {
			fmt.Fprintf(&b, "\t\t%s\n", rl)
		}
		b.WriteString("\t}\n")
	}
	for _, sb := range sandboxes {
		for _, k := range sandboxChainKinds() {
			fmt.Fprintf(&b, "\tchain %s {\n", sandboxChain(sb.id, k.kind))
			for _, rl := range sb.rules[k.kind] {
				fmt.Fprintf(&b, "\t\t%s\n", rl)
			}
			b.WriteString("\t}\n")
		}
	}
	b.WriteString("}\n")
	return b.String()
}

type renderedSandbox struct {
	id, iface string
	rules     map[chainKind][]rule
}
