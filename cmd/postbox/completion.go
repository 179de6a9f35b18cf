package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Shell completion: postbox completion bash|zsh|fish prints a script
// that completes the commands, their subcommands and their flags. The
// script is made from the command table itself, each command run in
// probe mode (cmdEnv.probe), so a command added to it is completed with
// no change here.

// shells are the shells postbox completes, with the script of each.
var shells = map[string]func(io.Writer, []cmdNode) error{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}

func runCompletion(_ context.Context, env *cmdEnv, args []string) error {
	env.offer(slices.Sorted(maps.Keys(shells))...)
	fs := newFlags(env, "completion", "bash|zsh|fish", `Prints a script that completes postbox's commands, their subcommands and flags in bash,
zsh or fish. Load it in the current shell, or install it for every new one:

  bash:  source <(postbox completion bash)
         postbox completion bash > ~/.local/share/bash-completion/completions/postbox
  zsh:   source <(postbox completion zsh)
         postbox completion zsh > "${fpath[1]}/_postbox"
  fish:  postbox completion fish | source
         postbox completion fish > ~/.config/fish/completions/postbox.fish`)
	if err := parse(env, fs, args); err != nil {
		return err
	}
	shell, err := args1(fs, "shell (bash, zsh or fish)")
	if err != nil {
		return err
	}
	write, ok := shells[shell]
	if !ok {
		hint := ""
		if near := nearest(shell, slices.Sorted(maps.Keys(shells))); near != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", near)
		}
		return usagef("completion: no completion for %q%s: use bash, zsh or fish", shell, hint)
	}
	return write(env.stdout, commandTree())
}

// cmdProbe is what a command run in probe mode told of itself: its
// subcommands and its flags. In probe mode a command stops at parse,
// before it does anything.
type cmdProbe struct {
	subs []subcommand
	fs   *flag.FlagSet
}

// errProbed ends a command run in probe mode.
var errProbed = errors.New("probed")

// offer records, when env probes a command, the subcommands it takes
// (their summaries, when it has a table of them, as the group commands
// do).
func (env *cmdEnv) offer(names ...string) {
	subs := make([]subcommand, len(names))
	for i, n := range names {
		subs[i].name = n
	}
	env.offerTable(subs)
}

// offerTable is offer for a group's table.
func (env *cmdEnv) offerTable(subs []subcommand) {
	if env.probe != nil {
		env.probe.subs = subs
	}
}

// cmdNode is a command or subcommand with its summary, flags (old
// spellings left out) and subcommands.
type cmdNode struct {
	name, summary string
	flags         []string
	subs          []cmdNode
}

// commandTree probes every command of the table and each of its
// subcommands.
func commandTree() []cmdNode {
	var tree []cmdNode
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		node := cmdNode{name: name, summary: commands[name].summary}
		p := probe(name)
		node.flags = p.flags()
		for _, sub := range p.subs {
			node.subs = append(node.subs, cmdNode{name: sub.name, summary: sub.summary, flags: probe(name, sub.name).flags()})
		}
		tree = append(tree, node)
	}
	return tree
}

// probe runs postbox args in probe mode and returns what it recorded.
func probe(args ...string) *cmdProbe {
	p := &cmdProbe{}
	env := &cmdEnv{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }, probe: p}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing a probed command might start gets to run
	commands[args[0]].run(ctx, env, args[1:])
	return p
}

// flags returns the flags the probed command declared.
func (p *cmdProbe) flags() []string {
	if p.fs == nil {
		return nil
	}
	return flagNames(p.fs)
}

// bashCompletion writes the bash script.
func bashCompletion(w io.Writer, tree []cmdNode) error {
	var b strings.Builder
	b.WriteString(`# bash completion for postbox, made by: postbox completion bash
_postbox() {
    local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} sub="" subs="" flags=""
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "` + strings.Join(nodeNames(tree), " ") + `" -- "$cur"))
        return
    fi
    case $cmd in
`)
	for _, n := range tree {
		if len(n.subs) > 0 {
			fmt.Fprintf(&b, "    %s) subs=%q ;;\n", n.name, strings.Join(nodeNames(n.subs), " "))
		}
	}
	b.WriteString(`    esac
    if [[ $COMP_CWORD -gt 2 && " $subs " == *" ${COMP_WORDS[2]} "* ]]; then
        sub=${COMP_WORDS[2]}
    fi
    case $cmd/$sub in
`)
	for _, n := range tree {
		if len(n.flags) > 0 {
			fmt.Fprintf(&b, "    %s/) flags=%q ;;\n", n.name, dashed(n.flags))
		}
		for _, s := range n.subs {
			if len(s.flags) > 0 {
				fmt.Fprintf(&b, "    %s/%s) flags=%q ;;\n", n.name, s.name, dashed(s.flags))
			}
		}
	}
	b.WriteString(`    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    elif [[ $COMP_CWORD -eq 2 && -n $subs ]]; then
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    fi
}
complete -o default -F _postbox postbox
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// zshCompletion writes the zsh script.
func zshCompletion(w io.Writer, tree []cmdNode) error {
	var b strings.Builder
	b.WriteString(`#compdef postbox
# zsh completion for postbox, made by: postbox completion zsh
_postbox() {
    local cmd=${words[2]} sub="" flags=""
    local -a subs
    if (( CURRENT == 2 )); then
        local -a cmds
        cmds=(
`)
	for _, n := range tree {
		fmt.Fprintf(&b, "            %s\n", zshQuote(n.name+":"+strings.ReplaceAll(n.summary, ":", `\:`)))
	}
	b.WriteString(`        )
        _describe 'command' cmds
        return
    fi
    case $cmd in
`)
	for _, n := range tree {
		if len(n.subs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "    %s) subs=(", n.name)
		for i, s := range n.subs {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(zshQuote(s.name + ":" + strings.ReplaceAll(s.summary, ":", `\:`)))
		}
		b.WriteString(") ;;\n")
	}
	b.WriteString(`    esac
    if (( CURRENT > 3 )) && (( ${subs[(I)${words[3]}:*]} )); then
        sub=${words[3]}
    fi
    case $cmd/$sub in
`)
	for _, n := range tree {
		if len(n.flags) > 0 {
			fmt.Fprintf(&b, "    %s/) flags=%s ;;\n", n.name, zshQuote(dashed(n.flags)))
		}
		for _, s := range n.subs {
			if len(s.flags) > 0 {
				fmt.Fprintf(&b, "    %s/%s) flags=%s ;;\n", n.name, s.name, zshQuote(dashed(s.flags)))
			}
		}
	}
	b.WriteString(`    esac
    if [[ $PREFIX == -* ]]; then
        compadd -- ${=flags}
    elif (( CURRENT == 3 && ${#subs} > 0 )); then
        _describe 'command' subs
    else
        _files
    fi
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _postbox "$@"
else
    compdef _postbox postbox
fi
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// fishCompletion writes the fish script.
func fishCompletion(w io.Writer, tree []cmdNode) error {
	var b strings.Builder
	b.WriteString(`# fish completion for postbox, made by: postbox completion fish
# __postbox_at CMD [SUB]: the words before the cursor are postbox CMD [SUB]
# and nothing else yet (SUB "": no subcommand); __postbox_in CMD SUB: the
# command line is in postbox CMD SUB; __postbox_own CMD SUBS...: in
# postbox CMD, and not in one of its SUBS.
function __postbox_at
    set -l w (commandline -opc)
    test (count $w) -eq (math (count $argv) + 1); or return 1
    test "$w[2]" = "$argv[1]"
end
function __postbox_in
    set -l w (commandline -opc)
    test (count $w) -ge 3; and test "$w[2]" = "$argv[1]"; and test "$w[3]" = "$argv[2]"
end
function __postbox_own
    set -l w (commandline -opc)
    test (count $w) -ge 2; and test "$w[2]" = "$argv[1]"; or return 1
    test (count $w) -lt 3; or not contains -- "$w[3]" $argv[2..-1]
end
complete -c postbox -f
`)
	for _, n := range tree {
		fmt.Fprintf(&b, "complete -c postbox -n 'test (count (commandline -opc)) -eq 1' -a %s -d %s\n", fishQuote(n.name), fishQuote(n.summary))
	}
	for _, n := range tree {
		for _, s := range n.subs {
			fmt.Fprintf(&b, "complete -c postbox -n '__postbox_at %s' -a %s -d %s\n", n.name, fishQuote(s.name), fishQuote(s.summary))
		}
		own := "__postbox_own " + n.name
		for _, s := range n.subs {
			own += " " + s.name
		}
		for _, f := range n.flags {
			fmt.Fprintf(&b, "complete -c postbox -n %s -l %s\n", fishQuote(own), f)
		}
		for _, s := range n.subs {
			for _, f := range s.flags {
				fmt.Fprintf(&b, "complete -c postbox -n '__postbox_in %s %s' -l %s\n", n.name, s.name, f)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func nodeNames(nodes []cmdNode) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.name
	}
	return out
}

// dashed is the flags as typed: --name, space-separated.
func dashed(flags []string) string {
	return "--" + strings.Join(flags, " --")
}

// zshQuote quotes s for zsh (and any POSIX shell) in single quotes.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// fishQuote quotes s for fish in single quotes.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(s) + "'"
}
