#!/usr/bin/python3
"""Print the host's Debian apt sources for its release as one-line `deb URI SUITE COMPONENTS`
entries, for mmdebstrap: the box is built from the mirror the host already uses (a proxy or a
snapshot keeps working), never from a hard-coded one. Third-party repositories are left out."""
import glob
import re
import sys


def codename() -> str:
    for line in open("/etc/os-release"):
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    sys.exit("apt-sources: no VERSION_CODENAME in /etc/os-release")


def entries():
    """(uri, suite, components) from one-line .list files and deb822 .sources files."""
    for path in ["/etc/apt/sources.list", *glob.glob("/etc/apt/sources.list.d/*.list")]:
        try:
            lines = open(path).read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            line = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 4 and line[0] == "deb":
                yield line[1], line[2], line[3:]
    for path in glob.glob("/etc/apt/sources.list.d/*.sources"):
        for stanza in re.split(r"\n\s*\n", open(path).read()):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if "deb" not in fields.get("types", []) or fields.get("enabled", ["yes"]) == ["no"]:
                continue
            for uri in fields.get("uris", []):
                for suite in fields.get("suites", []):
                    yield uri, suite, fields.get("components", [])


def main():
    release = codename()
    out = []
    for uri, suite, comps in entries():
        if (suite == release or suite.startswith(release + "-")) and "main" in comps:
            line = f"deb {uri} {suite} main"
            if line not in out:
                out.append(line)
    if not out:
        sys.exit(f"apt-sources: no apt source for {release} main in /etc/apt")
    print("\n".join(out))


if __name__ == "__main__":
    main()
