// Package powercut is a filesystem for tests that loses, at a simulated
// power cut, what its files had not synced.
//
// FS mounts (FUSE) a directory that passes every operation through to a
// directory on disk, and keeps, for each file, the writes and truncations
// made since the file was last synced (fsync or fdatasync), with the bytes
// each replaced. Cut stands for pulling the plug once the processes using
// the files have been killed: it unmounts, turns every file back to what
// its last sync made durable (or, with some, to that plus a random
// selection of the later writes, in order, as a disk might have written
// back part of its cache), and mounts the directory again.
//
// What it does not model: directory entries (a file created, renamed or
// removed stays so, as if the directory had been synced), torn writes
// within one write call, and the shared-memory index of a SQLite
// database in WAL mode (`-shm`), which SQLite rebuilds after a crash and
// which is passed through as written.
//
// Mounting needs /dev/fuse and the right to mount (root); Mount skips the
// test without them, or fails it under POSTBOX_REQUIRE_SERVICES=1.
// POWERCUT_DEBUG=1 logs every request the filesystem serves.
package powercut

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/postbox-events/postbox/internal/testenv"
)

// FS is a mounted powercut filesystem.
type FS struct {
	dir, disk string

	mu     sync.Mutex
	server *fuse.Server
	files  map[uint64]*file // by inode, the files written since their last sync
	fail   int              // writes still to fail with EIO (FailWrites)
}

// FailWrites makes the next n writes to any file fail with EIO, as a disk
// having a hiccup would, without writing anything.
func (f *FS) FailWrites(n int) {
	f.mu.Lock()
	f.fail = n
	f.mu.Unlock()
}

// file is what a file did since its last sync.
type file struct {
	path   string   // relative to the disk directory, as last written
	synced int64    // its size at its last sync
	ops    []op     // in order
	read   *os.File // the file on disk, to read what a write replaces
}

// op is a write (data at off) or a truncation (to size); pre is what it
// replaced within the file's size at the time.
type op struct {
	trunc bool
	off   int64 // a write's offset, or the size truncated to
	data  []byte
	pre   []byte
}

// Mount mounts a powercut filesystem over a new directory of the test's
// and unmounts it when the test ends.
func Mount(t testing.TB) *FS {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Skip(t, "no /dev/fuse: the power-cut test needs FUSE")
	}
	f := &FS{dir: t.TempDir(), disk: t.TempDir(), files: map[uint64]*file{}}
	if err := f.mount(); err != nil {
		testenv.Skip(t, "cannot mount a FUSE filesystem (root is needed): "+err.Error())
	}
	t.Cleanup(func() {
		if err := f.unmount(); err != nil {
			t.Errorf("powercut: unmount %s: %v", f.dir, err)
		}
	})
	return f
}

// Dir is the mounted directory, where the files that are to lose what
// they did not sync belong.
func (f *FS) Dir() string { return f.dir }

// Disk is the directory on disk behind Dir, as the last Cut left it.
func (f *FS) Disk() string { return f.disk }

// Cut simulates a power cut: every process with a file open under Dir
// must have been killed first. With keep false each file is left as its
// last sync made it; with keep true each write and truncation made since
// is kept with a chance of one half, the kept ones applied in order. It
// returns how many operations were lost, then mounts Dir again.
func (f *FS) Cut(keep bool) (lost int, err error) {
	if err := f.unmount(); err != nil {
		return 0, fmt.Errorf("powercut: unmount (is a process still using %s?): %w", f.dir, err)
	}
	f.mu.Lock()
	files := f.files
	f.files = map[uint64]*file{}
	f.mu.Unlock()
	for _, fl := range files {
		n, err := fl.revert(filepath.Join(f.disk, fl.path), keep)
		lost += n
		if err != nil {
			return lost, err
		}
	}
	return lost, f.mount()
}

func (f *FS) mount() error {
	root, err := fs.NewLoopbackRoot(f.disk)
	if err != nil {
		return err
	}
	lb := root.(*fs.LoopbackNode)
	srv, err := fs.Mount(f.dir, &node{LoopbackNode: lb, fs: f}, &fs.Options{
		MountOptions: fuse.MountOptions{DirectMountStrict: true, Debug: os.Getenv("POWERCUT_DEBUG") != "", FsName: "powercut", Name: "powercut"},
	})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.server = srv
	f.mu.Unlock()
	return nil
}

func (f *FS) unmount() error {
	f.mu.Lock()
	srv := f.server
	f.mu.Unlock()
	if srv == nil {
		return nil
	}
	if err := srv.Unmount(); err != nil {
		return err // still mounted: the test's end unmounts it, or says why not
	}
	srv.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.server = nil
	for _, fl := range f.files {
		fl.read.Close()
	}
	return nil
}

// revert turns the file at path back to its last sync, then applies the
// operations kept; it reports how many it lost.
func (fl *file) revert(path string, keep bool) (lost int, err error) {
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed since: nothing to turn back
	}
	if err != nil {
		return 0, err
	}
	defer w.Close()
	for i := len(fl.ops) - 1; i >= 0; i-- {
		o := fl.ops[i]
		if _, err := w.WriteAt(o.pre, o.off); err != nil {
			return 0, err
		}
	}
	if err := w.Truncate(fl.synced); err != nil {
		return 0, err
	}
	for _, o := range fl.ops {
		if keep && rand.IntN(2) == 0 {
			if o.trunc {
				err = w.Truncate(o.off)
			} else {
				_, err = w.WriteAt(o.data, o.off)
			}
			if err != nil {
				return lost, err
			}
			continue
		}
		lost++
	}
	return lost, nil
}

// track returns the record of n's file, begun now if it has none; nil
// for a file that is not tracked. f.mu is held.
func (f *FS) track(n *node) (*file, error) {
	return f.trackAt(n.StableAttr().Ino, n.Path(nil))
}

// trackAt is track for the file of inode ino at path.
func (f *FS) trackAt(ino uint64, path string) (*file, error) {
	if fl := f.files[ino]; fl != nil {
		fl.path = path
		return fl, nil
	}
	if strings.HasSuffix(path, "-shm") {
		return nil, nil
	}
	r, err := os.Open(filepath.Join(f.disk, path))
	if err != nil {
		return nil, err
	}
	st, err := r.Stat()
	if err != nil {
		r.Close()
		return nil, err
	}
	fl := &file{path: path, synced: st.Size(), read: r}
	f.files[ino] = fl
	return fl, nil
}

// node is a loopback node whose files are tracked.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeWrapChilder = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
)

func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), fs: n.fs}
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &handle{lf: fh.(*fs.LoopbackFile), n: n}, fuseFlags, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	child := ch.Operations().(*node)
	n.fs.mu.Lock()
	// From its creation, before the kernel knows its name: a new file is
	// empty until synced.
	_, err := n.fs.trackAt(child.StableAttr().Ino, filepath.Join(n.Path(nil), name))
	n.fs.mu.Unlock()
	if err != nil {
		fh.(*fs.LoopbackFile).Release(ctx)
		return nil, nil, 0, fs.ToErrno(err)
	}
	return ch, &handle{lf: fh.(*fs.LoopbackFile), n: child}, fuseFlags, 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if h, ok := f.(*handle); ok {
		f = h.lf
	}
	size, ok := in.GetSize()
	if !ok || n.IsDir() {
		return n.LoopbackNode.Setattr(ctx, f, in, out)
	}
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	fl, err := n.fs.track(n)
	if err != nil {
		return fs.ToErrno(err)
	}
	if fl != nil {
		st, err := fl.read.Stat()
		if err != nil {
			return fs.ToErrno(err)
		}
		o := op{trunc: true, off: int64(size)}
		if tail := st.Size() - o.off; tail > 0 {
			o.pre = make([]byte, tail)
			if _, err := fl.read.ReadAt(o.pre, o.off); err != nil {
				return fs.ToErrno(err)
			}
		}
		fl.ops = append(fl.ops, o)
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

// handle is an open file: a loopback file whose writes are recorded and
// whose syncs make them durable. It does not offer the kernel the file's
// descriptor, so no read or write passes around it.
type handle struct {
	lf *fs.LoopbackFile
	n  *node
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
	_ fs.FileLseeker   = (*handle)(nil)
	_ fs.FileAllocater = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, dest, off)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f := h.n.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return 0, syscall.EIO
	}
	fl, err := f.track(h.n)
	if err != nil {
		return 0, fs.ToErrno(err)
	}
	if fl != nil {
		pre := make([]byte, len(data))
		k, err := fl.read.ReadAt(pre, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, fs.ToErrno(err)
		}
		fl.ops = append(fl.ops, op{off: off, data: append([]byte(nil), data...), pre: pre[:k]})
	}
	return h.lf.Write(ctx, data, off)
}

// Fsync makes what the file did durable. The disk behind is not synced:
// the power cut this package simulates is the only one it guards against.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	f := h.n.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.files[h.n.StableAttr().Ino]
	if fl == nil {
		return 0
	}
	st, err := fl.read.Stat()
	if err != nil {
		return fs.ToErrno(err)
	}
	fl.synced, fl.ops = st.Size(), nil
	return 0
}

func (h *handle) Flush(ctx context.Context) syscall.Errno   { return h.lf.Flush(ctx) }
func (h *handle) Release(ctx context.Context) syscall.Errno { return h.lf.Release(ctx) }
func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}

// Allocate may grow the file: what it was before is recorded first.
func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	f := h.n.fs
	f.mu.Lock()
	_, err := f.track(h.n)
	f.mu.Unlock()
	if err != nil {
		return fs.ToErrno(err)
	}
	return h.lf.Allocate(ctx, off, size, mode)
}
