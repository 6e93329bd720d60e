//! Device telemetry through NVML (loaded at run time by nvml-wrapper, which returns an error,
//! not a panic, when `libnvidia-ml` is missing). Readings a device does not support are `None`.

use crate::error::{CudaError, Result};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;

/// One reading of a device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTelemetry {
    /// NVML's index of the device.
    pub index: u32,
    /// Device name.
    pub name: Option<String>,
    /// Percent of time a kernel ran over the last sample period.
    pub gpu_utilization_pct: Option<u32>,
    /// Percent of time memory was read or written.
    pub memory_utilization_pct: Option<u32>,
    /// Memory in use, bytes.
    pub memory_used: Option<u64>,
    /// Memory in total, bytes.
    pub memory_total: Option<u64>,
    /// GPU temperature, degrees Celsius.
    pub temperature_c: Option<u32>,
    /// Power draw, milliwatts.
    pub power_mw: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Option<u32>,
}

/// An NVML session.
pub struct Telemetry {
    nvml: Nvml,
}

fn nvml_err(what: &'static str) -> impl FnOnce(nvml_wrapper::error::NvmlError) -> CudaError {
    move |source| CudaError::Nvml { what, source }
}

impl Telemetry {
    /// Loads NVML; an error says why it is unavailable.
    pub fn new() -> Result<Self> {
        Ok(Telemetry {
            nvml: Nvml::init().map_err(nvml_err("init"))?,
        })
    }

    /// Number of devices NVML sees.
    pub fn device_count(&self) -> Result<u32> {
        self.nvml.device_count().map_err(nvml_err("device_count"))
    }

    /// Reads device `index`.
    pub fn read(&self, index: u32) -> Result<DeviceTelemetry> {
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(nvml_err("device_by_index"))?;
        let util = d.utilization_rates().ok();
        let mem = d.memory_info().ok();
        Ok(DeviceTelemetry {
            index,
            name: d.name().ok(),
            gpu_utilization_pct: util.as_ref().map(|u| u.gpu),
            memory_utilization_pct: util.as_ref().map(|u| u.memory),
            memory_used: mem.as_ref().map(|m| m.used),
            memory_total: mem.as_ref().map(|m| m.total),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_mw: d.power_usage().ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
        })
    }
}

/// Reads every device; an error when NVML is unavailable.
pub fn read_all() -> Result<Vec<DeviceTelemetry>> {
    let t = Telemetry::new()?;
    (0..t.device_count()?).map(|i| t.read(i)).collect()
}
