# SPACE's QEMU devices (configs/devices/x86_64-softmmu/space.mak in the build): the microvm
# machine and the devices buildQemuArgv gives a sandbox, nothing else. MICROVM selects what the
# machine itself needs (ISA serial, APIC, IOAPIC, i8259, i8254, RTC, virtio-mmio, ACPI).
CONFIG_MICROVM=y
CONFIG_VIRTIO_MMIO=y
CONFIG_VIRTIO_BLK=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_RNG=y
CONFIG_VIRTIO_NET=y
CONFIG_SERIAL_ISA=y
