/* print.c - the IR's text form (see the top of ir.h and docs/ir.md).
 *
 * Output is deterministic and parses back with ir_parse: for a compacted
 * graph, print(parse(print(g))) is byte-identical to print(g). Doubles print
 * in the shortest form that reads back to the same bits; inf, -inf and nan
 * print as those words. The printer tolerates invalid graphs (it is used for
 * dumps when verification fails): out-of-range ids print without a type.
 */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Shortest "%.Ng" that strtod reads back to the same double. */
const char *ir_fmt_double(double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "nan");
        return buf;
    }
    if (isinf(v)) {
        snprintf(buf, n, v < 0 ? "-inf" : "inf");
        return buf;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v && signbit(strtod(buf, NULL)) == signbit(v))
            return buf;
    }
    snprintf(buf, n, "%.17g", v);
    return buf;
}

static void print_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void print_init(FILE *f, const ParamInit *in)
{
    char a[40], b[40];
    switch (in->kind) {
    case INIT_NONE: fputs("none", f); break;
    case INIT_ZEROS: fputs("zeros", f); break;
    case INIT_ONES: fputs("ones", f); break;
    case INIT_NORMAL: fprintf(f, "normal(%s)", ir_fmt_double(in->a, a, sizeof a)); break;
    case INIT_UNIFORM:
        fprintf(f, "uniform(%s,%s)", ir_fmt_double(in->a, a, sizeof a),
                ir_fmt_double(in->b, b, sizeof b));
        break;
    default: fprintf(f, "init%d", (int)in->kind); break;
    }
}

static void print_list(FILE *f, const char *key, const int64_t *v, int n)
{
    fprintf(f, "%s=[", key);
    for (int i = 0; i < n && i < IR_MAX_RANK; i++)
        fprintf(f, "%s%lld", i ? "," : "", (long long)v[i]);
    fputc(']', f);
}

/* " {...}" for the op's attribute kind; nothing for AK_NONE / AK_SHAPE. */
static void print_attrs(FILE *f, const Op *op)
{
    const OpAttr *a = &op->attr;
    char d[40];
    switch (ir_opinfo[op->code].attr) {
    case AK_VALUE: fprintf(f, " {value=%s}", ir_fmt_double(a->f, d, sizeof d)); break;
    case AK_AXIS: fprintf(f, " {axis=%lld}", (long long)(a->nia ? a->ia[0] : -1)); break;
    case AK_AXES: fputs(" {", f); print_list(f, "axes", a->ia, a->nia); fputc('}', f); break;
    case AK_PERM: fputs(" {", f); print_list(f, "perm", a->ia, a->nia); fputc('}', f); break;
    case AK_START:
        fputs(" {", f);
        print_list(f, op->code == OP_PAD ? "lo" : "start", a->ia, a->nia);
        fputc('}', f);
        break;
    case AK_GEMM:
        fprintf(f, " {ta=%lld,tb=%lld}", (long long)(a->nia > 0 ? a->ia[0] : 0),
                (long long)(a->nia > 1 ? a->ia[1] : 0));
        break;
    case AK_CONV: {
        /* {kernel=[..],stride=[..],pad=[..],dilation=[..]}, one entry per
         * spatial dim */
        static const char *key[4] = {"kernel", "stride", "pad", "dilation"};
        int ns = a->nia / 4;
        fputs(" {", f);
        for (int w = 0; w < 4; w++) {
            if (w)
                fputc(',', f);
            print_list(f, key[w], a->ia + w * ns, ns);
        }
        fputc('}', f);
        break;
    }
    case AK_KEY: fprintf(f, " {key=%lld}", (long long)(a->nia ? a->ia[0] : -1)); break;
    case AK_BUCKET: fprintf(f, " {bucket=%lld}", (long long)(a->nia ? a->ia[0] : -1)); break;
    case AK_SHARD:
        fprintf(f, " {bucket=%lld,start=%lld,total=%lld,nranks=%lld}", (long long)a->ia[0],
                (long long)a->ia[1], (long long)a->ia[2], (long long)a->ia[3]);
        break;
    case AK_TP:
        fprintf(f, " {axis=%lld,n=%lld,rank=%lld", (long long)a->ia[0], (long long)a->ia[1],
                (long long)a->ia[2]);
        if (a->nia == 4)
            fprintf(f, ",sum=%lld", (long long)a->ia[3]);
        fputc('}', f);
        break;
    case AK_ATTN:
        fprintf(f, " {causal=%lld,scale=%s", (long long)(a->nia ? a->ia[0] : 0),
                ir_fmt_double(a->f, d, sizeof d));
        if (ir_attn_heads(a))
            fprintf(f, ",heads=%lld,hd=%lld,qoff=%lld,koff=%lld,voff=%lld", (long long)a->ia[1],
                    (long long)a->ia[2], (long long)a->ia[3], (long long)a->ia[4],
                    (long long)a->ia[5]);
        if (ir_attn_heads(a) && ir_attn_kvh(a) != a->ia[1])
            fprintf(f, ",kvh=%lld", (long long)ir_attn_kvh(a));
        if (ir_attn_window(a))
            fprintf(f, ",window=%lld", (long long)ir_attn_window(a));
        if (ir_attn_alibi(a))
            fputs(",alibi=1", f);
        if (ir_attn_bias(a))
            fputs(ir_attn_bias(a) == IR_ATTN_MASK ? ",mask=1" : ",bias=1", f);
        fputc('}', f);
        break;
    default: break;
    }
}

static void print_value(FILE *f, const Graph *g, int id)
{
    char buf[256];
    if (id >= 0 && id < g->t.n)
        fprintf(f, "%%%d:%s", id, shape_str(g, &g->t.v[id].s, buf, sizeof buf));
    else
        fprintf(f, "%%%d", id);
}

void ir_print(const Graph *g, FILE *f)
{
    fputs("kiln-ir v2\n", f);
    if (g->syms.n) {
        fputs("sym", f);
        for (int i = 0; i < g->syms.n; i++)
            fprintf(f, " %s=%lld", g->syms.v[i].name, (long long)g->syms.v[i].value);
        fputc('\n', f);
    }
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op != -1)
            continue;
        print_value(f, g, i);
        fprintf(f, " = %s ", ir_kind_name(t->kind));
        print_quoted(f, t->name);
        if (t->kind != TK_INPUT || t->init.kind != INIT_NONE) {
            fputc(' ', f);
            print_init(f, &t->init);
        }
        if (t->shard.on) {
            fprintf(f, " shard(axis=%d,blocks=%d", t->shard.axis, t->shard.blocks);
            if (t->shard.n)
                fprintf(f, ",n=%d,rank=%d", t->shard.n, t->shard.rank);
            fputc(')', f);
        }
        fputc('\n', f);
    }
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        print_value(f, g, op->out);
        if ((unsigned)op->code >= OP__COUNT) {
            fprintf(f, " = <bad opcode %d>\n", (int)op->code);
            continue;
        }
        fprintf(f, " = %s", ir_opinfo[op->code].name);
        for (int j = 0; j < op->nin; j++)
            fprintf(f, "%s%%%d", j ? ", " : " ", op->in[j]);
        print_attrs(f, op);
        if (op->flags & OPF_BACKWARD)
            fputs(" !backward", f);
        if (op->flags & OPF_OPTIM)
            fputs(" !optim", f);
        if (op->flags & OPF_RECOMPUTE)
            fputs(" !recompute", f);
        if (op->group >= 0)
            fprintf(f, " !group=%d", op->group);
        if (op->loc.file)
            fprintf(f, "   # %s:%d", op->loc.file, op->loc.line);
        fputc('\n', f);
    }
    for (int i = 0; i < g->outs.n; i++) {
        fputs("output ", f);
        print_quoted(f, g->outs.v[i].name);
        fprintf(f, " %%%d\n", g->outs.v[i].t);
    }
    for (int i = 0; i < g->upd.n; i++)
        fprintf(f, "update %%%d <- %%%d\n", g->upd.v[i].target, g->upd.v[i].value);
    fputs("end\n", f);
}

char *ir_print_str(const Graph *g)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    if (!f)
        die("ir_print_str: open_memstream failed");
    ir_print(g, f);
    fclose(f);
    return s;
}
