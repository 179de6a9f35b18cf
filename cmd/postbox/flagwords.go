package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
)

// The command line's words: one spelling of each flag everywhere (a time
// range is --since and --until, following every page is --all-pages), the
// old spellings kept as hidden flags that say what they are now, and
// "did you mean" for a flag as for a command.

// oldNames holds, for each flag set, its old flag names and the flag each
// is now: old → name.
var oldNames sync.Map // *flag.FlagSet → map[string]string

// oldSpelling declares old as a hidden flag of fs that sets what the
// (already declared) flag name sets: a spelling kept working after a
// rename. --help does not list it; parse prints a note naming the new
// spelling when it is given, and refuses both together. Its environment
// variable (POSTBOX_DLQ_FROM) is still read after the new one's.
func oldSpelling(fs *flag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	fs.Var(f.Value, old, "the old spelling of --"+name)
	m, _ := oldNames.LoadOrStore(fs, map[string]string{})
	m.(map[string]string)[old] = name
}

// oldNamesOf returns the old names of fs's flags (old → name).
func oldNamesOf(fs *flag.FlagSet) map[string]string {
	m, _ := oldNames.Load(fs)
	names, _ := m.(map[string]string)
	return names
}

// isOldName reports whether the flag name of fs is an old spelling.
func isOldName(fs *flag.FlagSet, name string) bool {
	_, ok := oldNamesOf(fs)[name]
	return ok
}

// oldVars returns the environment variables derived from the old
// spellings of flag f of fs, as envVars derives them.
func oldVars(fs *flag.FlagSet, f *flag.Flag) []string {
	var vars []string
	olds := oldNamesOf(fs)
	for _, old := range slices.Sorted(maps.Keys(olds)) {
		if olds[old] == f.Name {
			vars = append(vars, envVars(fs, &flag.Flag{Name: old})[0])
		}
	}
	return vars
}

// checkOldNames notes on w each old spelling set on the command line and
// records the flag it stands for as given there; an old and a new
// spelling of one flag together are a usage error.
func checkOldNames(w io.Writer, fs *flag.FlagSet, src map[string]string) error {
	olds := oldNamesOf(fs)
	for _, old := range slices.Sorted(maps.Keys(olds)) {
		name := olds[old]
		if src[old] == "" {
			continue
		}
		if src[name] != "" {
			return usagef("%s: --%s is the old spelling of --%s: give --%s alone", fs.Name(), old, name, name)
		}
		fmt.Fprintf(w, "postbox: %s: --%s is now --%s; the old spelling still works, for now\n", fs.Name(), old, name)
		src[name] = "--" + old
	}
	return nil
}

// printFlags prints the flags of fs as fs.PrintDefaults does, without the
// old spellings.
func printFlags(fs *flag.FlagSet) {
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if !isOldName(fs, f.Name) {
			shown.Var(f.Value, f.Name, usageWithVars(fs, f))
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

// flagNames returns the names of fs's flags, old spellings left out,
// sorted.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !isOldName(fs, f.Name) {
			names = append(names, f.Name)
		}
	})
	return names
}

// unknownFlagHint is " (did you mean --NAME?)" for the flag package's
// message about an undefined flag ("flag provided but not defined: -frm")
// when one of fs's flags is near, else "".
func unknownFlagHint(fs *flag.FlagSet, msg string) string {
	given, ok := strings.CutPrefix(msg, "flag provided but not defined: ")
	if !ok {
		return ""
	}
	given = strings.TrimLeft(given, "-")
	if near := nearest(given, flagNames(fs)); near != "" {
		return fmt.Sprintf(" (did you mean --%s?)", near)
	}
	return ""
}
