//! A job trying to hurt the host (issue 19): host-wide kernel budgets it must not be able
//! to exhaust and devices it must not create.

use pretty_assertions::assert_eq;

use super::common::Target;

/// `io_setup(65536, &ctx)` through libc's `syscall`, printing the result and errno.
const AIO_SETUP: &str = "import ctypes\n\
                         libc = ctypes.CDLL(None, use_errno=True)\n\
                         ctx = ctypes.c_ulong(0)\n\
                         r = libc.syscall(206, 65536, ctypes.byref(ctx))\n\
                         print(r, ctypes.get_errno())";

/// Tries a character and a block device node in /tmp, then a FIFO.
const MKNOD_DEVICES: &str = "import os, stat\n\
                             out = []\n\
                             for kind, name in ((stat.S_IFCHR, 'c'), (stat.S_IFBLK, 'b')):\n\
                             \x20   try:\n\
                             \x20       os.mknod('/tmp/' + name, 0o600 | kind, os.makedev(1, 3))\n\
                             \x20       out.append(name + ' made')\n\
                             \x20   except OSError as e:\n\
                             \x20       out.append(name + ' ' + str(e.errno))\n\
                             os.mkfifo('/tmp/f')\n\
                             out.append('fifo made')\n\
                             print(' '.join(out))";

conformance! {
    fn aio_contexts_are_refused(t: &Target) {
        let run = t.run(&["-c", AIO_SETUP]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "-1 1\n", "io_setup refused with EPERM");
    }

    fn device_nodes_cannot_be_created(t: &Target) {
        let run = t.run(&["-c", MKNOD_DEVICES]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "c 1 b 1 fifo made\n");
    }
}
