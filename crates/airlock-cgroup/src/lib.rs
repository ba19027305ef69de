//! airlock-cgroup: per-job cgroups on v1 and v2 hosts behind one interface.
