// worker.js runs llama.cpp (the prebuilt libllama inside node-llama-cpp's
// npm packages, CPU only) for tools/llamacompare: one JSON command per line
// on stdin, one JSON answer per line on stdout, so that the Go side can
// interleave the two engines' runs in one process tree.
//
//   {"cmd":"load","model":"x.gguf","threads":2,"context":4352,"batch":512}
//   {"cmd":"prefill","tokens":[...]}            -> {"ms":...}
//   {"cmd":"generate","tokens":[...],"n":129}   -> {"tokens":[...],"prefillMs":...,"decodeMs":...}
import readline from "node:readline";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const llama = await getLlama({gpu: false, build: "never", usePrebuiltBinaries: true, logLevel: LlamaLogLevel.warn});
let model = null, context = null;

async function load({model: path, threads, context: size, batch}) {
    if (context) await context.dispose();
    if (!model || model.path !== path) {
        if (model) await model.dispose();
        model = await llama.loadModel({modelPath: path, gpuLayers: 0});
        model.path = path;
    }
    context = await model.createContext({contextSize: size, batchSize: batch, threads, sequences: 1});
    return {loaded: path, threads, build: llama.buildType, cpu: llama.cpuMathCores ?? null};
}

async function freshSequence() {
    const seq = context.getSequence();
    await seq.clearHistory();
    return seq;
}

async function prefill({tokens}) {
    const seq = await freshSequence();
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(tokens);
    const ms = performance.now() - t0;
    seq.dispose();
    return {ms};
}

// generate decodes n tokens greedily, end-of-generation tokens included (as
// ddflash with IgnoreEOS); prefillMs runs to the first token,
// decodeMs from there to the last (n-1 decode steps).
async function generate({tokens, n}) {
    const seq = await freshSequence();
    const out = [];
    const t0 = performance.now();
    let t1 = t0;
    for await (const tok of seq.evaluate(tokens, {temperature: 0, yieldEogToken: true})) {
        if (out.length === 0) t1 = performance.now();
        out.push(tok);
        if (out.length === n) break;
    }
    const t2 = performance.now();
    seq.dispose();
    return {tokens: out, prefillMs: t1 - t0, decodeMs: t2 - t1};
}

const handlers = {load, prefill, generate};
const rl = readline.createInterface({input: process.stdin});
for await (const line of rl) {
    let answer;
    try {
        const msg = JSON.parse(line);
        const h = handlers[msg.cmd];
        answer = h ? await h(msg) : {error: `unknown command ${msg.cmd}`};
    } catch (e) {
        answer = {error: String(e && e.stack || e)};
    }
    process.stdout.write(JSON.stringify(answer) + "\n");
}
process.exit(0);
