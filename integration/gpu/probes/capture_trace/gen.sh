#!/usr/bin/env bash
# gen.sh NAMES_FILE OUTDIR: writes names.h and tramp.S (one exported trampoline per entry point: save the argument
# registers, call trace_pre(index, first argument), restore them, jump to the real entry point).
set -euo pipefail
names=$1 out=$2
mapfile -t N < <(sort -u "$names")
{
  echo "#define TRACE_N ${#N[@]}"
  printf '#define TRACE_NAMES'; for n in "${N[@]}"; do printf ' "%s",' "$n"; done; echo
} >"$out/names.h"
{
  echo '    .text'
  for i in "${!N[@]}"; do
    n=${N[$i]}
    cat <<ASM
    .globl $n
    .type $n,@function
$n:
    push %rdi; push %rsi; push %rdx; push %rcx; push %r8; push %r9
    sub \$8, %rsp
    mov %rdi, %rsi
    mov \$$i, %edi
    call trace_pre@PLT
    add \$8, %rsp
    pop %r9; pop %r8; pop %rcx; pop %rdx; pop %rsi; pop %rdi
    mov trace_real@GOTPCREL(%rip), %rax
    jmp *$((i * 8))(%rax)
    .size $n, .-$n
ASM
  done
  echo '    .section .note.GNU-stack,"",@progbits'
} >"$out/tramp.S"
