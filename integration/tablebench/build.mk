# C micro-benchmarks of the table client fast path (internal/table/detshare_table_client.h).
TABLEBENCH := $(TESTBIN)/tablebench
C_TARGETS += $(TABLEBENCH)

$(TABLEBENCH): integration/tablebench/tablebench.c internal/table/detshare_table.h internal/table/detshare_table_client.h
	@mkdir -p $(TESTBIN)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS_EXTRA) -o $@ $< -lpthread
