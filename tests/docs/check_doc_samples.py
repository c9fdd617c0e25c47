#!/usr/bin/env python3
"""Checks that every code sample is compiled: each usage sample in the comments of an
installed header (worker/include/dlrun/*.h: consecutive comment lines starting with "//   ",
anywhere in the file) and each
```cpp block of README.md and docs/*.md must appear, line for line (leading and trailing blanks ignored), in
tests/docs/doc_samples.cc, which the build compiles against dlrun::worker.
  check_doc_samples.py SOURCE_DIR"""
import glob
import os
import sys


def header_samples(path):
    samples, current = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("//   "):
                current.append(line[2:].strip())
            elif current:
                samples.append(current)
                current = []
    if current:
        samples.append(current)
    return samples


def readme_samples(path):
    samples, current, inside = [], [], False
    with open(path) as f:
        for line in f:
            if line.strip() == "```cpp":
                inside, current = True, []
            elif inside and line.strip() == "```":
                inside = False
                samples.append(current)
            elif inside:
                current.append(line.strip())
    return samples


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "tests/docs/doc_samples.cc")) as f:
        compiled = [l.strip() for l in f if l.strip()]
    sources = [(h, header_samples(h)) for h in sorted(glob.glob(os.path.join(root, "worker/include/dlrun/*.h")))]
    for doc in [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs/*.md"))):
        sources.append((doc, readme_samples(doc)))
    failures, count = 0, 0
    for path, samples in sources:
        for sample in samples:
            lines = [l for l in sample if l and not l.startswith("#include")]
            if not lines:
                continue
            count += 1
            n = len(lines)
            if not any(compiled[i:i + n] == lines for i in range(len(compiled) - n + 1)):
                failures += 1
                print(f"{os.path.relpath(path, root)}: this sample is not in tests/docs/doc_samples.cc "
                      f"(copy it there so that it is compiled):\n  " + "\n  ".join(lines))
    if count == 0:
        print("no samples found")
        return 1
    print(f"{count} samples checked, {failures} not compiled")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
