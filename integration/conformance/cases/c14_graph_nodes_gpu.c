/* Case 14 (real GPU only: the simulated GPU has no child-graph or conditional nodes; conformance_test.go gpuOnly):
 * the capture patterns of issue 28 that need a real driver (README.md; a capture as the process's first GPU work is
 * c15_first_capture).
 *   child          a captured graph inserted into another graph as a child-graph node;
 *   cond_if        conditional IF nodes (handle default 1: the body runs; default 0: it does not) whose bodies are
 *                  filled by cuStreamBeginCaptureToGraph, as PyTorch's torch.cond capture does. CUDA requires every
 *                  body node to be in the conditional node's context. */
#include "conf.h"

#define N 4096
#define ROUNDS 3

/* Entry points outside CONF_FUNCS (the test double has none of them): taken by name from the driver. */
static void *drv_sym(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *p = h ? dlsym(h, name) : NULL;
    if (!p) {
        printf("fatal: %s not found in libcuda.so.1 (this case needs a real driver, 12.4+)\n", name);
        exit(2);
    }
    return p;
}

/* A conditional IF node in g with handle default def, its body captured on s: z = 7 (memset), w = z + z. */
static void add_if(CUgraph g, unsigned def, CUstream s, CUdeviceptr z, CUdeviceptr w) {
    PFN_cuGraphConditionalHandleCreate mkh = (PFN_cuGraphConditionalHandleCreate)drv_sym("cuGraphConditionalHandleCreate");
    /* the 12.3+ entry point (CUDA 13's headers name only this one cuGraphAddNode) */
    PFN_cuGraphAddNode_v2 add = (PFN_cuGraphAddNode_v2)drv_sym("cuGraphAddNode_v2");
    PFN_cuStreamBeginCaptureToGraph into = (PFN_cuStreamBeginCaptureToGraph)drv_sym("cuStreamBeginCaptureToGraph");
    CUgraphConditionalHandle h;
    CK(mkh(&h, g, conf_ctx, def, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = conf_ctx;
    CUgraphNode n;
    CK(add(&n, g, NULL, NULL, 0, &p));
    CUgraph body = p.conditional.phGraph_out[0];
    char k[64];
    snprintf(k, sizeof k, "cond_if%u.capture_rc", def);
    fact(k, "%s", st(into(s, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL)));
    CK(D.cuMemsetD32Async(z, bits(7.0f), N, s));
    k_add(s, w, z, z, N);
    CUgraph got = NULL;
    snprintf(k, sizeof k, "cond_if%u.end_rc", def);
    fact(k, "%s", st(D.cuStreamEndCapture(s, &got)));
    size_t nn = 0;
    CK(D.cuGraphGetNodes(body, NULL, &nn));
    snprintf(k, sizeof k, "cond_if%u.body_nodes", def);
    fact(k, "%zu", nn);
}

int main(void) {
    conf_init("graph_nodes_gpu");
    CUstream S = mkstream(CU_STREAM_NON_BLOCKING);

    CUdeviceptr y = dalloc(N * 4);
    CUgraphExec ge;
    CUresult r;

    /* 1. a child-graph node: the graph of one round (x = 1, y += 2x) inside another graph, replayed 3 times */
    PFN_cuGraphAddChildGraphNode addChild = (PFN_cuGraphAddChildGraphNode)drv_sym("cuGraphAddChildGraphNode");
    PFN_cuGraphCreate mkGraph = (PFN_cuGraphCreate)drv_sym("cuGraphCreate");
    CUdeviceptr x = dalloc(N * 4);
    CK(D.cuMemsetD32_v2(y, 0, N));
    CK(D.cuStreamBeginCapture_v2(S, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(D.cuMemsetD32Async(x, bits(1.0f), N, S));
    k_axpy(S, y, x, 2.0f, N);
    CUgraph child;
    CK(D.cuStreamEndCapture(S, &child));
    CUgraph parent;
    CK(mkGraph(&parent, 0));
    CUgraphNode cn;
    fact("child.add_rc", "%s", st(addChild(&cn, parent, NULL, 0, child)));
    CK(D.cuGraphInstantiateWithFlags(&ge, parent, 0));
    for (int i = 0; i < ROUNDS; i++)
        CK(D.cuGraphLaunch(ge, S));
    CK(D.cuStreamSynchronize(S));
    fact("child.replay_ok", "%s", yn(all_f32(y, N, 2.0f * ROUNDS)));
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(parent));
    CK(D.cuGraphDestroy(child));

    /* 2. conditional IF nodes, bodies captured into: default 1 runs the body, default 0 does not */
    CUdeviceptr z1 = dalloc(N * 4), w1 = dalloc(N * 4), z0 = dalloc(N * 4), w0 = dalloc(N * 4);
    CUgraph cg;
    CK(mkGraph(&cg, 0));
    add_if(cg, 1, S, z1, w1);
    add_if(cg, 0, S, z0, w0);
    r = D.cuGraphInstantiateWithFlags(&ge, cg, 0);
    fact("cond_if.instantiate_rc", "%s", st(r));
    if (r != CUDA_SUCCESS) {
        printf("fatal: conditional graph not instantiated\n");
        return 2;
    }
    CK(D.cuGraphLaunch(ge, S));
    CK(D.cuStreamSynchronize(S));
    fact("cond_if1.body_ran", "%s", yn(all_f32(w1, N, 14.0f)));
    fact("cond_if0.body_skipped", "%s", yn(all_f32(w0, N, 0.0f) && all_f32(z0, N, 0.0f)));
    CK(D.cuGraphExecDestroy(ge));
    CK(D.cuGraphDestroy(cg));
    conf_done();
    return 0;
}
