"""`python -m dlrun --cmake-prefix-path`: where the wheel put the C++ worker library's CMake
package (as torch.utils.cmake_prefix_path is for Torch). `python -m dlrun ARGS...`: runs the
dlrun executable the wheel installed with ARGS, in this process's place."""
import os
import shutil
import sys
import sysconfig


def _prefixes():
    """The installation prefixes the wheel's data files may be under, most likely first."""
    seen = []
    for scheme_path in (sysconfig.get_path("data"), sys.prefix, os.path.expanduser("~/.local")):
        if scheme_path and scheme_path not in seen:
            seen.append(scheme_path)
    try:
        from importlib import metadata

        dist = metadata.distribution("dlrun")
        for f in dist.files or []:
            if f.name == "dlrunConfig.cmake":
                cfg = os.path.abspath(str(dist.locate_file(f)))
                seen.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(cfg)))))
                break
    except Exception:  # not installed as a distribution (a source checkout): the schemes only
        pass
    return seen


def cmake_prefix_path():
    for p in _prefixes():
        for libdir in ("lib", "lib64"):
            if os.path.isfile(os.path.join(p, libdir, "cmake", "dlrun", "dlrunConfig.cmake")):
                return p
    return None


def main(argv):
    if argv == ["--cmake-prefix-path"]:
        p = cmake_prefix_path()
        if p is None:
            sys.stderr.write("dlrun: no CMake package of dlrun in %s: pip install dlrun installs one\n"
                             % ", ".join(_prefixes()))
            return 1
        print(p)
        return 0
    exe = None
    for p in _prefixes():
        cand = os.path.join(p, "bin", "dlrun")
        if os.access(cand, os.X_OK):
            exe = cand
            break
    exe = exe or shutil.which("dlrun")
    if exe is None:
        sys.stderr.write("dlrun: no dlrun executable installed beside this package: pip install dlrun\n")
        return 1
    os.execv(exe, [exe] + argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
