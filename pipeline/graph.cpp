#include "pipeline/graph.hpp"

#include <tbb/flow_graph.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <tuple>

#include "pipeline/core/error.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/run_stats.hpp"

namespace precompute {

// Note [The graph]
//
//   source -> limiter -> prepare (parallel) -> sequencer -> router (serial) --> encode video --+
//                ^                                                          +-> encode audio --+
//                |                                                          +-> encode text  --+
//                |                                                          +-> outline -------+
//                +----------------- samples completed ---------------- writer (serial) <-------+
//
// - The limiter bounds the samples between the source and the writer's completion of them, so
//   decoded frames in memory do not grow with the dataset (the writer keeps only embeddings of
//   the shards it is assembling).
// - prepare decodes and tokenises many samples at once; the sequencer restores input order so
//   that batches are cut deterministically (Note [Deterministic batches]).
// - Each encode node runs as many batches at once as its modality has devices; the encoder pool
//   hands each call its own device.
// - One serial writer touches HDF5.
// An exception from any body cancels the graph and wait_for_all() rethrows it.

namespace {

// Note [A stop drops the samples in flight]
// After a stop request (SIGINT, SIGTERM, SIGHUP) the source takes no more samples, and the
// samples already taken are dropped rather than finished: a prepare or encode body that starts
// after the stop throws StoppedError, which cancels the graph, and a decode under way is cut
// short by its deadline, which counts a stop as passed (Note [Sample deadline]), its result
// dropped here so that no record of the cut reaches a shard. The shards the writer completed
// before are committed (the committer is finished after the graph); a dropped sample is
// redone on resume, so nothing is lost but its work. What a stop still waits for: encoder calls
// already running (one batch each) and the shards being written, not the decoding of every
// sample admitted (up to run.max_in_flight of them, each up to run.sample_timeout_s). A decoder
// stuck inside one call holds the stop; a second signal then exits at once
// (pipeline/core/stop_request.cpp).
void throw_if_stopped() {
  if (stop_requested()) {
    throw StoppedError(stop_signal(), "stopped: the samples in flight are dropped", __FILE__,
                       __LINE__);
  }
}

void build_and_run(const std::vector<SampleSpec>& input, const std::vector<int64_t>& positions,
                   const PrepareFn& prepare_sample, BatchRouter& router,
                   const EncodeStage& encoder, ShardAssembler& assembler, RunStats& stats,
                   const GraphSettings& settings) {
  namespace flow = tbb::flow;
  PC_ASSERT(settings.max_in_flight >= 1 && settings.decode_concurrency >= 1,
            "graph settings must be positive");
  flow::graph g;

  size_t next = 0;
  flow::input_node<SampleSpec> source(g, [&](tbb::flow_control& control) -> SampleSpec {
    // A stop (SIGINT/SIGTERM) takes no more samples (Note [A stop drops the samples in
    // flight]).
    if (next < positions.size() && settings.before_sample) settings.before_sample();
    if (next == positions.size() || stop_requested()) {
      control.stop();
      return {};
    }
    stats.submitted.fetch_add(1, std::memory_order_relaxed);
    SampleSpec spec = input[static_cast<size_t>(positions[next])];
    spec.order = static_cast<int64_t>(next++);
    return spec;
  });

  // Decremented by the number of samples the writer completes.
  flow::limiter_node<SampleSpec, int64_t> limiter(g, settings.max_in_flight);

  flow::function_node<SampleSpec, PreparedSamplePtr> prepare(
      g, static_cast<size_t>(settings.decode_concurrency),
      [&prepare_sample](const SampleSpec& spec) {
        throw_if_stopped();
        auto prepared = prepare_sample(spec);
        throw_if_stopped();  // its decode may have been cut short by the stop
        return prepared;
      });

  flow::sequencer_node<PreparedSamplePtr> in_order(
      g, [](const PreparedSamplePtr& s) { return static_cast<size_t>(s->order); });

  using RouterPorts = std::tuple<ModalityBatch, ModalityBatch, ModalityBatch, WriterMessage>;
  using Router = flow::multifunction_node<PreparedSamplePtr, RouterPorts>;
  Router route(g, flow::serial, [&](const PreparedSamplePtr& sample, Router::output_ports_type& ports) {
    const StageTimer timer(stats.route_ns);
    auto routed = router.route(sample);
    stats.routed.fetch_add(1, std::memory_order_relaxed);
    std::get<3>(ports).try_put(WriterMessage(std::move(routed.outline)));
    for (auto& batch : routed.batches) {
      batch.cut_at = std::chrono::steady_clock::now();
      const auto m = batch.modality;
      stats.batches_queued[modality_index(m)].fetch_add(1, std::memory_order_relaxed);
      switch (m) {
        case Modality::kVideo:
          std::get<0>(ports).try_put(std::move(batch));
          break;
        case Modality::kAudio:
          std::get<1>(ports).try_put(std::move(batch));
          break;
        case Modality::kText:
          std::get<2>(ports).try_put(std::move(batch));
          break;
      }
    }
  });

  using Writer = flow::multifunction_node<WriterMessage, std::tuple<int64_t>>;
  Writer write(g, flow::serial, [&](const WriterMessage& message, Writer::output_ports_type& ports) {
    const StageTimer timer(stats.assemble_ns);
    const int64_t completed = assembler.add(message);
    if (completed > 0) std::get<0>(ports).try_put(completed);
  });

  using Encode = flow::function_node<ModalityBatch, WriterMessage>;
  std::vector<std::unique_ptr<Encode>> encode_nodes;
  for (Modality m : kAllModalities) {
    const size_t concurrency = settings.encode_concurrency[modality_index(m)];
    if (concurrency == 0) continue;
    encode_nodes.push_back(std::make_unique<Encode>(
        g, concurrency, [&encoder](const ModalityBatch& b) {
          throw_if_stopped();
          return WriterMessage(std::make_shared<EncodedBatch>(encoder(b)));
        }));
    auto& node = *encode_nodes.back();
    switch (m) {
      case Modality::kVideo:
        flow::make_edge(flow::output_port<0>(route), node);
        break;
      case Modality::kAudio:
        flow::make_edge(flow::output_port<1>(route), node);
        break;
      case Modality::kText:
        flow::make_edge(flow::output_port<2>(route), node);
        break;
    }
    flow::make_edge(node, write);
  }

  flow::make_edge(source, limiter);
  flow::make_edge(limiter, prepare);
  flow::make_edge(prepare, in_order);
  flow::make_edge(in_order, route);
  flow::make_edge(flow::output_port<3>(route), write);
  flow::make_edge(flow::output_port<0>(write), limiter.decrementer());

  source.activate();
  try {
    g.wait_for_all();
  } catch (const StoppedError&) {
    // Cancelled by a stop (Note [A stop drops the samples in flight]): the caller commits what
    // the writer completed and reports the stop.
  }
}

}  // namespace

void run_graph(const std::vector<SampleSpec>& input, const std::vector<int64_t>& positions,
               const PrepareFn& prepare, BatchRouter& router, const EncodeStage& encoder,
               ShardAssembler& assembler, RunStats& stats, const GraphSettings& settings) {
  const auto run = [&] {
    build_and_run(input, positions, prepare, router, encoder, assembler, stats, settings);
  };
  if (settings.threads <= 0) {
    run();
    return;
  }
  const auto threads = static_cast<size_t>(settings.threads);
  tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism, threads);
  tbb::task_arena arena(settings.threads);
  arena.execute(run);
}

}  // namespace precompute
