"""Thin ctypes binding of the few libbpf calls we need (libbpf.so.1 from Debian's libbpf1).

bcc 0.26 cannot run BPF_PROG_TEST_RUN and cannot open a pinned map without compiling a
program, so map access by path and test runs go straight to libbpf."""
from __future__ import annotations

import ctypes as ct
import os
from functools import lru_cache

_lib = ct.CDLL("libbpf.so.1", use_errno=True)

_lib.bpf_obj_get.argtypes = [ct.c_char_p]
_lib.bpf_obj_get.restype = ct.c_int
for _name in ("bpf_map_lookup_elem", "bpf_map_delete_elem", "bpf_map_get_next_key"):
    getattr(_lib, _name).restype = ct.c_int
_lib.bpf_map_lookup_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
_lib.bpf_map_update_elem.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_uint64]
_lib.bpf_map_update_elem.restype = ct.c_int
_lib.bpf_map_delete_elem.argtypes = [ct.c_int, ct.c_void_p]
_lib.bpf_map_get_next_key.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
_lib.bpf_obj_get_info_by_fd.argtypes = [ct.c_int, ct.c_void_p, ct.POINTER(ct.c_uint32)]
_lib.bpf_obj_get_info_by_fd.restype = ct.c_int
_lib.libbpf_num_possible_cpus.restype = ct.c_int
_lib.bpf_map_lookup_batch.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_void_p,
                                      ct.c_void_p, ct.POINTER(ct.c_uint32), ct.c_void_p]
_lib.bpf_map_lookup_batch.restype = ct.c_int
_lib.bpf_map_update_batch.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p, ct.POINTER(ct.c_uint32),
                                      ct.c_void_p]
_lib.bpf_map_update_batch.restype = ct.c_int

BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
PERCPU_MAP_TYPES = {5, 6, 10}  # percpu_hash, percpu_array, lru_percpu_hash


class BpfError(OSError):
    pass


def error(ret: int, what: str) -> BpfError:
    """The error of a failed libbpf call (ret < 0), named after what it did."""
    err = ct.get_errno() or -ret
    return BpfError(err, f"{what}: {os.strerror(err)}")


def check(ret: int, what: str) -> int:
    if ret < 0:
        raise error(ret, what)
    return ret


class MapInfo(ct.Structure):
    # struct bpf_map_info from the kernel UAPI (stable ABI; only the leading fields are used)
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("key_size", ct.c_uint32),
                ("value_size", ct.c_uint32), ("max_entries", ct.c_uint32),
                ("map_flags", ct.c_uint32), ("name", ct.c_char * 16), ("rest", ct.c_uint8 * 128)]


def obj_get(path: str) -> int:
    return check(_lib.bpf_obj_get(str(path).encode()), f"open pinned {path}")


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    size = ct.c_uint32(ct.sizeof(info))
    check(_lib.bpf_obj_get_info_by_fd(fd, ct.byref(info), ct.byref(size)), "map info")
    return info


@lru_cache(maxsize=None)
def possible_cpus() -> int:
    return check(_lib.libbpf_num_possible_cpus(), "possible cpus")


class TestRunOpts(ct.Structure):
    # struct bpf_test_run_opts (libbpf 1.x)
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("ctx_in", ct.c_void_p), ("ctx_out", ct.c_void_p),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


_lib.bpf_prog_test_run_opts.argtypes = [ct.c_int, ct.POINTER(TestRunOpts)]
_lib.bpf_prog_test_run_opts.restype = ct.c_int

lib = _lib


class ProgInfo(ct.Structure):
    # struct bpf_prog_info from the kernel UAPI, up to the run-time statistics
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("tag", ct.c_uint8 * 8),
                ("jited_prog_len", ct.c_uint32), ("xlated_prog_len", ct.c_uint32),
                ("jited_prog_insns", ct.c_uint64), ("xlated_prog_insns", ct.c_uint64),
                ("load_time", ct.c_uint64), ("created_by_uid", ct.c_uint32),
                ("nr_map_ids", ct.c_uint32), ("map_ids", ct.c_uint64), ("name", ct.c_char * 16),
                ("ifindex", ct.c_uint32), ("gpl_compatible", ct.c_uint32),
                ("netns_dev", ct.c_uint64), ("netns_ino", ct.c_uint64),
                ("nr_jited_ksyms", ct.c_uint32), ("nr_jited_func_lens", ct.c_uint32),
                ("jited_ksyms", ct.c_uint64), ("jited_func_lens", ct.c_uint64),
                ("btf_id", ct.c_uint32), ("func_info_rec_size", ct.c_uint32),
                ("func_info", ct.c_uint64), ("nr_func_info", ct.c_uint32),
                ("nr_line_info", ct.c_uint32), ("line_info", ct.c_uint64),
                ("jited_line_info", ct.c_uint64), ("nr_jited_line_info", ct.c_uint32),
                ("line_info_rec_size", ct.c_uint32), ("jited_line_info_rec_size", ct.c_uint32),
                ("nr_prog_tags", ct.c_uint32), ("prog_tags", ct.c_uint64),
                ("run_time_ns", ct.c_uint64), ("run_cnt", ct.c_uint64),
                ("recursion_misses", ct.c_uint64), ("verified_insns", ct.c_uint32),
                ("attach_btf_obj_id", ct.c_uint32), ("attach_btf_id", ct.c_uint32)]


def prog_info(fd: int) -> ProgInfo:
    """The kernel's view of a loaded program; run_time_ns/run_cnt count only while
    sysctl kernel.bpf_stats_enabled=1."""
    info = ProgInfo()
    size = ct.c_uint32(ct.sizeof(info))
    check(_lib.bpf_obj_get_info_by_fd(fd, ct.byref(info), ct.byref(size)), "program info")
    return info
