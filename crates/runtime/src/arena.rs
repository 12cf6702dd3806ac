//! ONNX Runtime's CPU arena: the one that sessions share by default (registered in the
//! environment once per process), and the allocator's own counters, so that memory can be split
//! into what tensors use and what the arena keeps around them.

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr};

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::AsPointer;

use crate::{Result, RuntimeError, Session};

/// The counters of a session's CPU allocator (ONNX Runtime's `AllocatorGetStats`), in bytes
/// where they are sizes. An allocator without an arena reports nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArenaStats {
    /// Bytes in tensors now.
    pub in_use: u64,
    /// Bytes the arena holds from the system (used or not).
    pub reserved: u64,
    /// Most bytes in tensors at any one time.
    pub peak_in_use: u64,
    /// The largest single allocation.
    pub largest_allocation: u64,
    /// Allocations served.
    pub allocations: u64,
    /// Times the arena grew.
    pub extensions: u64,
}

impl ArenaStats {
    /// From ONNX Runtime's key-value counters (`InUse`, `TotalAllocated`, `MaxInUse`, ...);
    /// `None` when they hold none of them (an allocator that keeps no statistics).
    pub fn from_counters(counters: &BTreeMap<String, String>) -> Option<Self> {
        let get = |key: &str| counters.get(key).and_then(|v| v.parse::<u64>().ok());
        Some(ArenaStats {
            in_use: get("InUse")?,
            reserved: get("TotalAllocated").unwrap_or(0),
            peak_in_use: get("MaxInUse").unwrap_or(0),
            largest_allocation: get("MaxAllocSize").unwrap_or(0),
            allocations: get("NumAllocs").unwrap_or(0),
            extensions: get("NumArenaExtensions").unwrap_or(0),
        })
    }
}

impl Session {
    /// The counters of the session's CPU allocator; `None` when it keeps none (the arena is
    /// off).
    pub fn arena_stats(&self) -> Result<Option<ArenaStats>> {
        let context = "reading the CPU allocator's statistics";
        let info = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Arena, MemoryType::Default)
            .map_err(RuntimeError::ort(context))?;
        let allocator = Allocator::new(&self.inner, info).map_err(RuntimeError::ort(context))?;
        Ok(ArenaStats::from_counters(&allocator_counters(&allocator).map_err(RuntimeError::ort(context))?))
    }
}

/// Every counter `AllocatorGetStats` reports for `allocator`.
#[allow(unsafe_code)]
fn allocator_counters(allocator: &Allocator) -> ort::Result<BTreeMap<String, String>> {
    let api = ort::api();
    let mut pairs = std::ptr::null_mut();
    // SAFETY: `allocator` is a live allocator of the session; ONNX Runtime fills `pairs` with a
    // new key-value set, released below.
    let status = unsafe { (api.AllocatorGetStats)(allocator.ptr(), &mut pairs) };
    // SAFETY: `status` comes straight from the call above.
    unsafe { ort::Error::result_from_status(status) }?;
    if pairs.is_null() {
        return Ok(BTreeMap::new());
    }
    let mut keys: *const *const c_char = std::ptr::null();
    let mut values: *const *const c_char = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: `pairs` is the set just returned; the arrays it hands out live until it is released.
    unsafe { (api.GetKeyValuePairs)(pairs, &mut keys, &mut values, &mut count) };
    let mut counters = BTreeMap::new();
    for i in 0..count {
        // SAFETY: index below `count`, each entry a NUL-terminated string owned by `pairs`.
        let (key, value) = unsafe { (CStr::from_ptr(*keys.add(i)), CStr::from_ptr(*values.add(i))) };
        counters.insert(key.to_string_lossy().into_owned(), value.to_string_lossy().into_owned());
    }
    // SAFETY: releases exactly the set AllocatorGetStats created; nothing borrowed from it remains.
    unsafe { (api.ReleaseKeyValuePairs)(pairs) };
    Ok(counters)
}

impl crate::Runtime {
    /// Registers, once per process, the CPU arena that sessions with [`crate::Arena::Shared`]
    /// take from ONNX Runtime's environment: it grows by what each allocation needs (ONNX
    /// Runtime's `kSameAsRequested`), not by powers of two.
    pub(crate) fn register_shared_arena(&self) -> Result<()> {
        self.shared_arena
            .get_or_init(|| register_arena(self).map_err(|e| e.to_string()))
            .clone()
            .map_err(|message| RuntimeError::Ort { context: "registering the shared CPU arena".into(), message })
    }
}

/// ONNX Runtime's `ArenaExtendStrategy::kSameAsRequested`.
const SAME_AS_REQUESTED: usize = 1;

#[allow(unsafe_code)]
fn register_arena(runtime: &crate::Runtime) -> Result<()> {
    let context = "registering the shared CPU arena";
    let api = ort::api();
    let keys = [c"arena_extend_strategy".as_ptr()];
    let values = [SAME_AS_REQUESTED];
    let mut config = std::ptr::null_mut();
    // SAFETY: one key and one value, alive for the call; ONNX Runtime copies them.
    let status = unsafe { (api.CreateArenaCfgV2)(keys.as_ptr(), values.as_ptr(), keys.len(), &mut config) };
    // SAFETY: `status` comes straight from the call above.
    unsafe { ort::Error::result_from_status(status) }.map_err(RuntimeError::ort(context))?;
    let info = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Arena, MemoryType::Default)
        .map_err(RuntimeError::ort(context))?;
    // SAFETY: the environment, memory info and config are alive; the allocator keeps a copy of
    // the config.
    let status = unsafe { (api.CreateAndRegisterAllocator)(runtime.env.ptr().cast_mut(), info.ptr(), config) };
    // SAFETY: releases the config created above.
    unsafe { (api.ReleaseArenaCfg)(config) };
    // SAFETY: `status` comes straight from the registration call.
    unsafe { ort::Error::result_from_status(status) }.map_err(RuntimeError::ort(context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_name_and_an_empty_set_is_none() {
        let counters: BTreeMap<String, String> =
            [("InUse", "10"), ("TotalAllocated", "64"), ("MaxInUse", "40"), ("NumAllocs", "3"), ("Limit", "0")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let stats = ArenaStats::from_counters(&counters).expect("stats");
        assert_eq!((stats.in_use, stats.reserved, stats.peak_in_use, stats.allocations), (10, 64, 40, 3));
        assert_eq!(ArenaStats::from_counters(&BTreeMap::new()), None);
    }
}
