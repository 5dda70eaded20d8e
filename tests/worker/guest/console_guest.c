/* A guest for the VMM's boot-path test that is not Linux: a freestanding 64-bit ELF the VMM
 * loads as it loads a vmlinux and enters in long mode with the zero page in rsi. It prints
 * what it was handed (the command line and the e820 memory map, read from the zero page as a
 * kernel reads them) on COM1, then writes to the console until the VMM stops it. Built by
 * tests/worker/test_vm.py with gcc in a second: the boot path is tested without the guest
 * kernel a PVM host cannot run and need not build. */

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long u64;

/* Offsets in struct boot_params (the x86 boot protocol's zero page). */
#define E820_ENTRIES 0x1e8
#define CMD_LINE_PTR 0x228
#define E820_TABLE 0x2d0

static void outb(unsigned short port, u8 value) {
    __asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

static u8 inb(unsigned short port) {
    u8 value;
    __asm__ volatile("inb %1, %0" : "=a"(value) : "Nd"(port));
    return value;
}

static void putc_serial(char c) {
    while (!(inb(0x3f8 + 5) & 0x20)) { /* transmitter holding register empty */
    }
    outb(0x3f8, (u8)c);
}

static void puts_serial(const char *s) {
    while (*s) putc_serial(*s++);
}

static void hex(u64 v) {
    puts_serial("0x");
    for (int shift = 60; shift >= 0; shift -= 4) putc_serial("0123456789abcdef"[(v >> shift) & 0xf]);
}

void guest_main(const u8 *zero_page) {
    puts_serial("sprout test guest\ncommand line: ");
    puts_serial((const char *)(u64) * (const u32 *)(zero_page + CMD_LINE_PTR));
    puts_serial("\n");
    u8 entries = zero_page[E820_ENTRIES];
    for (u8 i = 0; i < entries; i++) {
        const u8 *entry = zero_page + E820_TABLE + 20 * i; /* addr u64, size u64, type u32 */
        u64 addr = *(const u64 *)entry, size = *(const u64 *)(entry + 8);
        puts_serial("e820: ");
        hex(addr);
        puts_serial("-");
        hex(addr + size - 1);
        puts_serial(*(const u32 *)(entry + 16) == 1 ? " usable\n" : " reserved\n");
    }
    for (;;) puts_serial("flood ");
}

/* The VMM enters here with the zero page in rsi and a stack in rsp. */
__asm__(".globl _start\n_start:\n  mov %rsi, %rdi\n  call guest_main\n1: hlt\n  jmp 1b\n");
